"""MAG240M's layout (OGB-LSC, as `ogb.lsc.MAG240MDataset` downloads it):

    ROOT/meta.pt                                           {"paper": N, "author": A, "institution": I}
    ROOT/split_dict.pt                                     {"train", "valid", "test-dev", "test-challenge"}: paper IDs
    ROOT/processed/paper/node_feat.npy                     (N, 768) float16
    ROOT/processed/paper/node_label.npy                    (N,) float, NaN: unlabelled
    ROOT/processed/paper___cites___paper/edge_index.npy    (2, E) int64, per-type IDs
    ROOT/processed/author___writes___paper/edge_index.npy
    ROOT/processed/author___affiliated_with___institution/edge_index.npy

Papers carry the features; authors and institutions have none. The .pt files are read by
`torch_file` (tensors, NumPy arrays and plain containers; nothing they name can run). The test-dev
and test-challenge labels are hidden in the public release, so `test` is empty unless
`test_split` names a split whose papers are labelled.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError, GraphSchema, NodeType

from .base import load_npy, relation_edges, reversed_relations, slice_chunks
from .torch_file import load_torch_file

RELATIONS = (("paper", "cites", "paper"), ("author", "writes", "paper"),
             ("author", "affiliated_with", "institution"))
TYPES = ("paper", "author", "institution")


def load_pt(path: Path) -> Any:
    """A .pt file of tensors, arrays and plain containers (never code), or an error naming it."""
    return load_torch_file(path)


class MAG240MSource:
    def __init__(self, root: str | Path, add_reverse: bool = True, test_split: str | None = None):
        self.root = Path(root)
        self.name = "mag240m"
        self.symmetric = False
        self.add_reverse = add_reverse
        self.test_split = test_split
        meta = load_pt(self.root / "meta.pt")
        try:
            counts = {t: int(meta[t]) for t in TYPES}
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{self.root / 'meta.pt'}: expected node counts {list(TYPES)} ({exc!r})") from None
        self._features = load_npy(self.root / "processed" / "paper" / "node_feat.npy", "paper features")
        if self._features.ndim != 2 or self._features.shape[0] != counts["paper"]:
            raise DatasetError(f"{self.root / 'processed/paper/node_feat.npy'}: shape {self._features.shape}, "
                               f"expected ({counts['paper']}, dim)")
        self.feat_dim = int(self._features.shape[1])
        self.default_dtype = "float16"
        self.schema = GraphSchema((NodeType("paper", counts["paper"], True), NodeType("author", counts["author"], False),
                                   NodeType("institution", counts["institution"], False)),
                                  tuple(reversed_relations(list(RELATIONS), add_reverse)), "paper")
        self.num_nodes = self.schema.num_nodes

    def load_relation_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        return relation_edges(relation, len(RELATIONS), self._forward_edges)

    def _forward_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        src_type, name, dst_type = RELATIONS[relation]
        path = self.root / "processed" / f"{src_type}___{name}___{dst_type}" / "edge_index.npy"
        edges = load_npy(path, f"{name} edges")
        if edges.ndim != 2 or edges.shape[0] != 2:
            raise DatasetError(f"{path}: shape {edges.shape}, expected (2, edges)")
        offsets = self.schema.offsets
        src = np.asarray(edges[0], np.int64) + offsets[self.schema.type_id(src_type)]
        dst = np.asarray(edges[1], np.int64) + offsets[self.schema.type_id(dst_type)]
        return src, dst

    def load_labels(self) -> np.ndarray:
        path = self.root / "processed" / "paper" / "node_label.npy"
        given = np.asarray(load_npy(path, "paper labels"), np.float64)
        if given.shape != (self.schema.node_types[0].count,):
            raise DatasetError(f"{path}: shape {given.shape}, expected ({self.schema.node_types[0].count},)")
        labels = np.full(self.num_nodes, np.nan)
        labels[: len(given)] = given
        return labels

    def load_splits(self) -> dict[str, np.ndarray]:
        path = self.root / "split_dict.pt"
        splits = load_pt(path)
        if not isinstance(splits, dict) or not {"train", "valid"} <= set(splits):
            raise DatasetError(f"{path}: expected a dict with 'train' and 'valid' paper IDs")
        if self.test_split is not None and self.test_split not in splits:
            raise DatasetError(f"{path}: no split {self.test_split!r} (it has {sorted(splits)})")
        test = splits[self.test_split] if self.test_split else np.empty(0, np.int64)
        return {k: np.asarray(v, np.int64).reshape(-1) for k, v in
                (("train", splits["train"]), ("valid", splits["valid"]), ("test", test))}

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        return slice_chunks(self._features, start_row, chunk_rows)

    def input_paths(self) -> list[Path]:
        return [self.root]

    def describe(self) -> dict[str, Any]:
        return {"kind": "mag240m", "add_reverse": self.add_reverse, "test_split": self.test_split}
