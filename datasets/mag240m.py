"""MAG240M's layout (OGB-LSC, as `ogb.lsc.MAG240MDataset` downloads it):

    ROOT/meta.pt                                           {"paper": N, "author": A, "institution": I}
    ROOT/split_dict.pt                                     {"train", "valid", "test-dev", "test-challenge"}: paper IDs
    ROOT/processed/paper/node_feat.npy                     (N, 768) float16
    ROOT/processed/paper/node_label.npy                    (N,) float, NaN: unlabelled
    ROOT/processed/paper___cites___paper/edge_index.npy    (2, E) int64, per-type IDs
    ROOT/processed/author___writes___paper/edge_index.npy
    ROOT/processed/author___affiliated_with___institution/edge_index.npy

Papers carry the features; authors and institutions have none. The .pt files are read as
tensors only, or as NumPy arrays through an unpickler that admits nothing else (OGB saves
the splits as NumPy arrays, which torch 2.2's weights_only loader refuses). The test-dev
and test-challenge labels are hidden in the public release, so `test` is empty unless
`test_split` names a split whose papers are labelled.
"""
from __future__ import annotations

import pickle
import types
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from gnnssd.storage_format import DatasetError, GraphSchema, NodeType

from .base import (NUMPY_ARRAY_GLOBALS, AllowListUnpickler, load_npy, relation_edges, require_file,
                   reversed_relations, slice_chunks)

RELATIONS = (("paper", "cites", "paper"), ("author", "writes", "paper"),
             ("author", "affiliated_with", "institution"))
TYPES = ("paper", "author", "institution")


class _ArraysOnly(AllowListUnpickler):
    """Unpickles tensors, NumPy arrays and plain containers."""

    allowed = NUMPY_ARRAY_GLOBALS | {("collections", "OrderedDict"), ("_codecs", "encode")}  # an array's bytes
    holds = "tensors and arrays only"

    def admits(self, module: str, name: str) -> bool:
        """torch's own tensor and storage rebuilders."""
        return (module == "torch._utils" and name.startswith("_rebuild")) or \
            (module == "torch" and name.endswith("Storage"))


_ARRAYS_ONLY = types.SimpleNamespace(Unpickler=_ArraysOnly, load=pickle.load, __name__="arrays_only")


def load_pt(path: Path) -> Any:
    """A .pt file of tensors, arrays and plain containers (never code), or an error naming it."""
    try:
        return torch.load(require_file(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        pass  # NumPy arrays: the restricted unpickler below admits them
    except Exception as exc:  # torch raises errors of many kinds for a file that is no torch file
        raise DatasetError(f"{path}: not a torch file ({exc})") from exc
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_ARRAYS_ONLY)
    except Exception as exc:
        raise DatasetError(f"{path}: holds more than tensors and arrays ({exc})") from exc


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
