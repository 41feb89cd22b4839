"""DGL GraphBolt's OnDiskDataset for heterogeneous graphs (metadata.yaml with types):

    graph:        nodes: [{type: paper, num: N}, {type: author, num: A}, ...]
                  edges: [{type: "author:writes:paper", format: numpy|csv, path: ...}, ...]
                         # (2, E) per-type IDs; or "src,dst" lines
    feature_data: [{domain: node, type: paper, name: feat, format: numpy|torch, path: ...}]
    tasks:        [{name: ..., train_set / validation_set / test_set:
                      [{type: paper, data: [{name: seeds, ...}, {name: labels, ...}]}]}]

As a TypedSource: the types with the feature `feature` first (one dim for all), every
relation and, with `add_reverse`, a reverse `rev_NAME` per relation; the target type is
the one the task's sets are of.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError
from gnnssd.storage_format import GraphSchema

from .base import featured_types, padded_rows, relation_edges, reversed_relations, slice_chunks
from .graphbolt import SETS, GraphBoltMetadata


class GraphBoltHeteroSource(GraphBoltMetadata):
    symmetric = False

    def __init__(self, root: str | Path, task: str | None = None, feature: str = "feat",
                 add_reverse: bool = False):
        super().__init__(root)
        self.add_reverse = add_reverse
        if not self.nodes or any("type" not in n for n in self.nodes + self.edges):
            raise DatasetError(f"{self.yaml_path}: graph.nodes and graph.edges need a 'type' each "
                               "for a heterogeneous graph (an untyped one: `preprocess graphbolt`)")
        counts = {str(n["type"]): self._count(n, f"graph.nodes[type={n['type']}]") for n in self.nodes}
        features = {str(f["type"]): f for f in self.meta.get("feature_data") or []
                    if isinstance(f, dict) and f.get("domain") == "node" and f.get("name") == feature
                    and "type" in f}
        unknown = sorted(set(features) - set(counts))
        if unknown or not features:
            raise DatasetError(f"{self.yaml_path}: node feature {feature!r} of types {sorted(features)}; "
                               f"expected at least one of the node types {sorted(counts)}")
        self._features = {t: self._read(features[t], f"feature_data {t}/{feature}") for t in features}
        for t, array in self._features.items():
            if array.ndim != 2 or array.shape[0] != counts[t]:
                raise DatasetError(f"{self._path(features[t], '')}: shape {array.shape}, expected "
                                   f"({counts[t]}, dim) (node type {t!r})")
        self.feat_dim, types = featured_types(counts, {t: int(a.shape[1]) for t, a in self._features.items()})
        self._task = self._pick_task(self.meta.get("tasks") or [], task)
        self._sets = {split: self._typed_set(split) for split in SETS}
        targets = {t for t, _ in self._sets.values() if t is not None}
        if len(targets) != 1:
            raise DatasetError(f"{self.yaml_path}: the task's sets are of node types {sorted(targets)}; "
                               "expected one target type")
        self.target = targets.pop()
        forward = []
        for i, edge in enumerate(self.edges):
            relation = tuple(str(edge["type"]).split(":"))
            if len(relation) != 3 or relation[0] not in counts or relation[2] not in counts:
                raise DatasetError(f"{self.yaml_path}: graph.edges[{i}].type {edge['type']!r}, expected "
                                   f"'source:relation:destination' of the node types {sorted(counts)}")
            forward.append(relation)
        self._forward = forward
        relations = reversed_relations(forward, add_reverse)
        self.schema = GraphSchema(tuple(types), tuple(relations), self.target)  # type: ignore[arg-type]
        self.num_nodes = self.schema.num_nodes

    def _typed_set(self, split: str) -> tuple[str | None, dict[str, np.ndarray]]:
        """(node type, arrays by name) of a task set (None, {}) when the task has none."""
        key = SETS[split]
        entries = self._task.get(key) or []
        if not entries:
            return None, {}
        if len(entries) != 1 or "type" not in entries[0]:
            raise DatasetError(f"{self.yaml_path}: {key} has {len(entries)} entries; expected one with "
                               "a node 'type' (the target type's seeds and labels)")
        data = {item.get("name"): np.asarray(self._read(item, f"{key} {item.get('name')!r}"))
                for item in self._key(entries[0], "data", key)}
        return str(entries[0]["type"]), data

    def _offset(self, node_type: str) -> int:
        return int(self.schema.offsets[self.schema.type_id(node_type)])

    def load_relation_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        """Global IDs of relation `relation` (a reverse: its forward relation's pairs swapped)."""
        return relation_edges(relation, len(self._forward), self._forward_edges)

    def _forward_edges(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        src_type, _, dst_type = self._forward[k]
        src, dst = self._edge_pairs(self.edges[k], f"graph.edges[{k}]")
        return (np.asarray(src, np.int64) + self._offset(src_type),
                np.asarray(dst, np.int64) + self._offset(dst_type))

    def load_labels(self) -> np.ndarray:
        labels = np.full(self.num_nodes, -1, np.int64)
        count = self.schema.node_types[self.schema.type_id(self.target)].count
        for split, (_, data) in self._sets.items():
            seeds = self._seeds(data, SETS[split])
            if not len(seeds):
                continue
            if "labels" not in data or data["labels"].shape != seeds.shape:
                raise DatasetError(f"{self.yaml_path}: {SETS[split]} needs 'labels', one per seed")
            inside = (seeds >= 0) & (seeds < count)  # the writer reports the rest (as splits)
            given = np.asarray(data["labels"])
            bad = np.flatnonzero(~np.isfinite(given) | (given != np.round(given)) | (given < -1)) \
                if given.dtype.kind == "f" else np.flatnonzero(given < -1)
            if bad.size:
                raise DatasetError(f"{self.yaml_path}: {SETS[split]} labels: entry {int(bad[0])} is "
                                   f"{given[bad[0]]!r}, expected a class number (-1: unlabelled)")
            labels[seeds[inside] + self._offset(self.target)] = given[inside]
        return labels

    def load_splits(self) -> dict[str, np.ndarray]:
        return {split: np.asarray(self._seeds(data, SETS[split]), np.int64) + self._offset(self.target)
                for split, (_, data) in self._sets.items()}

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """The featured types' rows one type after another, from global row `start_row`."""
        offsets = self.schema.offsets
        for t, node_type in enumerate(self.schema.node_types):
            if node_type.features and start_row < offsets[t + 1]:
                for chunk in slice_chunks(self._features[node_type.name], max(start_row - int(offsets[t]), 0),
                                          chunk_rows):
                    yield padded_rows(chunk, self.feat_dim)

    def describe(self) -> dict[str, Any]:
        return {"kind": "graphbolt-hetero", "name": self.name, "task": self._task.get("name"),
                "add_reverse": self.add_reverse}
