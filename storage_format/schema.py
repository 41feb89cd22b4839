"""The typed shape of a graph: node types, relations, and where each type's nodes live.

A store numbers all nodes in one ID space, each node type a contiguous range in the order
the schema lists them, and keeps one CSC over all of them with the relation of every edge
beside it (`etypes.npy`, the in-edges of each node sorted by relation, then source). This
is GraphBolt's fused CSC: one topology, one sampler and one feature file for any number of
types. Types with features come first, so the feature rows are the prefix of the ID space
[0, feature_rows): one file, one I/O engine, one hot cache for all of them.

A homogeneous graph is the one-type, one-relation case (`GraphSchema.homogeneous`); its
manifest has no "schema" key and no etypes file, and its edge types are `ONE_RELATION`, an
empty array: every edge is relation 0. Edge types are an array on every graph, so the
layers above carry one shape and only the sampler picks a kernel by their count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import DatasetError

DEFAULT_NODE_TYPE = "_N"
DEFAULT_RELATION = "_E"
#: The longest name a node type or relation may have (bytes of UTF-8): one file name.
MAX_NAME_BYTES = 255
#: The edge types of a graph with one relation: none stored, every edge is relation 0.
ONE_RELATION = np.empty(0, np.int8)
ONE_RELATION.setflags(write=False)


def check_name(name: object, what: str) -> None:
    """Refuse (DatasetError naming `what` and the name) a node type or relation name that
    could not be one file name: names become the names of files (export's `TYPE-feat.npy`,
    a dataset's own files), so '../x', 'a/b' or an absolute path must not reach a path."""
    if not isinstance(name, str):
        raise DatasetError(f"graph schema: {what} {name!r} is a {type(name).__name__}, expected a string")
    problems = ((not name, "is empty"), ("/" in name, "contains '/'"), ("\0" in name, "contains a NUL byte"),
                (".." in name, "contains '..'"), (name.startswith("."), "starts with '.'"),
                (len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES, f"is longer than {MAX_NAME_BYTES} bytes"))
    problem = next((words for found, words in problems if found), "")
    if problem:
        raise DatasetError(f"graph schema: {what} {name[:80]!r}{'...' if len(name) > 80 else ''} {problem}; "
                           f"expected a plain name (no '/', '..' or NUL, not starting with '.', at most "
                           f"{MAX_NAME_BYTES} bytes): it becomes a file name")


@dataclass(frozen=True)
class NodeType:
    name: str
    count: int
    #: Whether this type's nodes have feature rows (all featured types share the dtype).
    features: bool
    #: The width of this type's own features when the featured types differ in it: their
    #: rows are stored padded with zeros to the widest (the store's feat_dim), so that one
    #: file, one row size and one engine serve them all; None: the store's feat_dim.
    dim: int | None = None


@dataclass(frozen=True)
class GraphSchema:
    node_types: tuple[NodeType, ...]
    #: Canonical relations (source type, relation name, destination type), indexed by edge type ID.
    relations: tuple[tuple[str, str, str], ...]
    #: The node type that has labels and splits.
    target: str

    def __post_init__(self) -> None:
        names = [t.name for t in self.node_types]
        if not names:
            raise DatasetError("graph schema: no node types")
        for name in names:
            check_name(name, "node type")
        for rel in self.relations:
            if len(rel) == 3:
                check_name(rel[1], "relation")
        if len(set(names)) != len(names):
            raise DatasetError(f"graph schema: node type names repeat: {names}")
        for t in self.node_types:
            if not isinstance(t.count, int) or t.count < 0:
                raise DatasetError(f"graph schema: node type {t.name!r} has count {t.count!r}, "
                                   "expected an integer >= 0")
            if t.dim is not None and (not t.features or not isinstance(t.dim, int) or t.dim < 1):
                raise DatasetError(f"graph schema: node type {t.name!r} has dim {t.dim!r}, expected "
                                   "a positive integer on a type with features (or none)")
        featured = [t.features for t in self.node_types]
        if featured != sorted(featured, reverse=True):
            raise DatasetError(f"graph schema: node types with features must come first, got "
                               f"{[(t.name, t.features) for t in self.node_types]}")
        if not self.relations:
            raise DatasetError("graph schema: no relations")
        if len(set(self.relations)) != len(self.relations):
            raise DatasetError(f"graph schema: relations repeat: {list(self.relations)}")
        if len({r for _, r, _ in self.relations}) != len(self.relations):
            raise DatasetError(f"graph schema: relation names must be distinct (DGL addresses a "
                               f"relation by its name): {list(self.relations)}")
        for rel in self.relations:
            if len(rel) != 3 or rel[0] not in names or rel[2] not in names:
                raise DatasetError(f"graph schema: relation {list(rel)} must be [source type, "
                                   f"name, destination type] with types among {names}")
        if self.target not in names:
            raise DatasetError(f"graph schema: target type {self.target!r} is not among {names}")
        if len(self.relations) > 2**15:
            raise DatasetError(f"graph schema: {len(self.relations)} relations; at most 2^15")

    @classmethod
    def homogeneous(cls, num_nodes: int) -> "GraphSchema":
        return cls((NodeType(DEFAULT_NODE_TYPE, int(num_nodes), True),),
                   ((DEFAULT_NODE_TYPE, DEFAULT_RELATION, DEFAULT_NODE_TYPE),), DEFAULT_NODE_TYPE)

    @property
    def is_homogeneous(self) -> bool:
        return len(self.node_types) == 1 and len(self.relations) == 1

    @property
    def type_names(self) -> list[str]:
        return [t.name for t in self.node_types]

    @property
    def num_nodes(self) -> int:
        return sum(t.count for t in self.node_types)

    @property
    def offsets(self) -> np.ndarray:
        """int64 (T+1,): type t's nodes are the IDs offsets[t] .. offsets[t+1]-1."""
        return np.concatenate([[0], np.cumsum([t.count for t in self.node_types])]).astype(np.int64)

    @property
    def feature_rows(self) -> int:
        """Rows of the feature file: the nodes of the featured types, a prefix of the IDs."""
        return sum(t.count for t in self.node_types if t.features)

    def widest_dim(self) -> int | None:
        """The widest of the featured types' own dims (None: they have the store's)."""
        return max((t.dim for t in self.node_types if t.dim is not None), default=None)

    def type_id(self, name: str) -> int:
        try:
            return self.type_names.index(name)
        except ValueError:
            raise KeyError(f"node type {name!r}: expected one of {self.type_names}") from None

    def type_of(self, ids: np.ndarray) -> np.ndarray:
        """The type ID of each node ID."""
        return (np.searchsorted(self.offsets, ids, side="right") - 1).astype(np.int64)

    def etype_dtype(self) -> np.dtype:
        return np.dtype(np.int8) if len(self.relations) <= 127 else np.dtype(np.int16)

    def to_manifest(self) -> dict[str, Any]:
        return {"node_types": [{"name": t.name, "count": t.count, "features": t.features,
                                **({} if t.dim is None else {"dim": t.dim})} for t in self.node_types],
                "relations": [list(r) for r in self.relations], "target": self.target}

    @classmethod
    def from_manifest(cls, entry: Any, where: str) -> "GraphSchema":
        """The schema of a manifest's "schema" entry; errors name `where` and the key."""
        try:
            types = tuple(NodeType(str(t["name"]), t["count"], bool(t["features"]), t.get("dim"))
                          for t in entry["node_types"])
            relations = tuple(tuple(str(p) for p in r) for r in entry["relations"])
            return cls(types, relations, str(entry["target"]))  # type: ignore[arg-type]
        except (KeyError, TypeError) as exc:
            raise DatasetError(f"{where}: schema is malformed ({exc!r}); expected node_types "
                               "[{name, count, features[, dim]}], relations [[src, name, dst]], target") from None
        except DatasetError as exc:
            raise DatasetError(f"{where}: {exc}") from None
