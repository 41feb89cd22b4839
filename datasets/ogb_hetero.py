"""The raw layout of OGB's heterogeneous node-property datasets (ogbn-mag):

    ROOT/raw/num-node-dict.csv.gz                      a header of node types, a row of counts
    ROOT/raw/triplet-type-list.csv.gz                  "src,rel,dst" per relation (optional:
                                                       else the folders under raw/relations)
    ROOT/raw/relations/SRC___REL___DST/edge.csv.gz     "src,dst" per edge, per-type IDs
    ROOT/raw/node-feat/TYPE/node-feat.csv.gz           feature rows of the types that have them
    ROOT/raw/node-label/TYPE/node-label.csv.gz         labels of the one target type
    ROOT/split/NAME/TYPE/{train,valid,test}.csv.gz     per-type IDs of the target type

As a TypedSource: featured types first (their rows are features.bin's), every relation
and, with `add_reverse` (DGL's MAG recipes), a reverse `rev_NAME` per relation.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from gnnssd.storage_format import DatasetError
from gnnssd.storage_format import GraphSchema, contained

from .base import featured_types, padded_rows, relation_edges, require_file, reversed_relations
from .ogb import checked_labels, csv_edges, csv_feature_chunks, csv_feature_dim
from .ogb_layout import read_splits, resolve_split_name


class OGBHeteroSource:
    def __init__(self, root: str | Path, split_name: str | None = None, add_reverse: bool = True):
        self.root = Path(root)
        self.name = self.root.name
        self.symmetric = False
        self.add_reverse = add_reverse
        counts = self._counts()
        featured = [t for t in counts if self._feat_path(t).is_file()]
        if not featured:
            raise DatasetError(f"{self.root / 'raw' / 'node-feat'}: no node type has features")
        self._dims = {t: csv_feature_dim(self._feat_path(t)) for t in featured}
        self.feat_dim, types = featured_types(counts, self._dims)
        labelled = sorted(p.name for p in (self.root / "raw" / "node-label").glob("*") if p.is_dir())
        if labelled:
            contained(self.root, "raw", "node-label", labelled[0], where="labelled node type")
        if len(labelled) != 1:
            raise DatasetError(f"{self.root / 'raw' / 'node-label'}: expected one labelled node type, "
                               f"found {labelled}")
        self.target = labelled[0]
        forward = self._relations(counts)
        relations = reversed_relations(forward, add_reverse)
        self.schema = GraphSchema(tuple(types), tuple(relations), self.target)
        self.num_nodes = self.schema.num_nodes
        self._forward = forward
        self.split_name = resolve_split_name(self.root, split_name)

    def _counts(self) -> dict[str, int]:
        path = require_file(self.root / "raw" / "num-node-dict.csv.gz")
        try:
            frame = pd.read_csv(path)
            counts = {str(k): int(v) for k, v in frame.iloc[0].items()}
        except (ValueError, OverflowError, OSError, EOFError, IndexError, pd.errors.ParserError) as exc:
            raise DatasetError(f"{path}: cannot parse as a header of node types and a row of counts ({exc})") from exc
        bad = {k: v for k, v in counts.items() if v < 0}
        if bad:
            raise DatasetError(f"{path}: negative node counts {bad}")
        return counts

    def _relations(self, counts: dict[str, int]) -> list[tuple[str, str, str]]:
        listed = self.root / "raw" / "triplet-type-list.csv.gz"
        if listed.is_file():
            frame = pd.read_csv(listed, header=None, dtype=str)
            relations = [tuple(row) for row in frame.itertuples(index=False)]
        else:
            relations = [tuple(p.name.split("___")) for p in sorted((self.root / "raw" / "relations").glob("*"))
                         if p.is_dir()]
        for rel in relations:
            if len(rel) != 3 or rel[0] not in counts or rel[2] not in counts:
                raise DatasetError(f"{self.root / 'raw'}: relation {list(rel)} is not [source type, name, "
                                   f"destination type] of the node types {sorted(counts)}")
        return relations  # type: ignore[return-value]

    def _feat_path(self, node_type: str) -> Path:
        return contained(self.root, "raw", "node-feat", node_type, "node-feat.csv.gz", where="node type")

    def load_relation_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        """Global IDs of relation `relation` (a reverse: its forward relation's pairs swapped)."""
        return relation_edges(relation, len(self._forward), self._forward_edges)

    def _forward_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        src_type, name, dst_type = self._forward[relation]
        path = require_file(contained(self.root, "raw", "relations", f"{src_type}___{name}___{dst_type}",
                                      "edge.csv.gz", where="relation"))
        src, dst = csv_edges(path)
        offsets = self.schema.offsets
        return src + offsets[self.schema.type_id(src_type)], dst + offsets[self.schema.type_id(dst_type)]

    def load_labels(self) -> np.ndarray:
        path = require_file(contained(self.root, "raw", "node-label", self.target, "node-label.csv.gz",
                                      where="labelled node type"))
        target = checked_labels(path)
        t = self.schema.type_id(self.target)
        if len(target) != self.schema.node_types[t].count:
            raise DatasetError(f"{path}: {len(target)} labels for {self.schema.node_types[t].count} "
                               f"{self.target!r} nodes")
        labels = np.full(self.num_nodes, -1.0)
        labels[self.schema.offsets[t]: self.schema.offsets[t + 1]] = target
        return labels

    def load_splits(self) -> dict[str, np.ndarray]:
        offset = self.schema.offsets[self.schema.type_id(self.target)]
        return {k: v + offset for k, v in read_splits(self.root, f"{self.split_name}/{self.target}").items()}

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """The featured types' rows one type after another, from global row `start_row`."""
        offsets = self.schema.offsets
        for t, node_type in enumerate(self.schema.node_types):
            if not node_type.features or start_row >= offsets[t + 1]:
                continue
            first = max(start_row - offsets[t], 0)
            rows = first
            for chunk in csv_feature_chunks(self._feat_path(node_type.name), self._dims[node_type.name], first,
                                            chunk_rows):
                rows += len(chunk)
                if rows > node_type.count:
                    break
                yield padded_rows(chunk, self.feat_dim)
            if rows != node_type.count:
                raise DatasetError(f"{self._feat_path(node_type.name)}: {rows if rows <= node_type.count else 'more'} "
                                   f"feature rows for {node_type.count} {node_type.name!r} nodes")

    def input_paths(self) -> list[Path]:
        return [self.root]

    def describe(self) -> dict[str, Any]:
        return {"kind": "ogb-hetero", "name": self.name, "split": self.split_name,
                "add_reverse": self.add_reverse}
