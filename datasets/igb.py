"""IGB260M's homogeneous layout (the `paper` nodes and `cites` edges), as its
`IGB260MDGLDataset` reads it:

    ROOT/SIZE/processed/paper/node_feat.npy             (N, 1024) float32 or float16
    ROOT/SIZE/processed/paper/node_label_19.npy         (N,) float (or node_label_2K.npy)
    ROOT/SIZE/processed/paper__cites__paper/edge_index.npy  (E, 2) int64

SIZE is experimental, small, medium, large or full. The large and full releases ship
node_feat and the label files as raw arrays without a .npy header; their node counts are
the published ones. Splits follow IGB's loader: the first 60% of the labelled nodes train,
the next 20% validate, the rest test (on full, only the first 227,130,858 nodes carry
19-class labels, 157,675,969 the 2K-class ones). IGB's loader also removes and re-adds
self-loops; this reader keeps the edges as they are.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError

from .base import load_npy, mapped_edge_chunks, require_file, slice_chunks

NUM_NODES = {"experimental": 100_000, "small": 1_000_000, "medium": 10_000_000,
             "large": 100_000_000, "full": 269_346_174}
LABELLED_ON_FULL = {"19": 227_130_858, "2K": 157_675_969}
FEAT_DIM = 1024


class IGBSource:
    def __init__(self, root: str | Path, size: str = "small", classes: str = "19",
                 symmetric: bool = False):
        if size not in NUM_NODES or classes not in LABELLED_ON_FULL:
            raise DatasetError(f"IGB size {size!r} / classes {classes!r}: expected size one of "
                               f"{list(NUM_NODES)} and classes one of {list(LABELLED_ON_FULL)}")
        self.folder = Path(root) / size / "processed"
        self.name = f"igb-{size}"
        self.size, self.classes, self.symmetric = size, classes, symmetric
        self._features = self._array(self.folder / "paper" / "node_feat.npy", "features", FEAT_DIM)
        self.num_nodes, self.feat_dim = self._features.shape
        self._label_path = self.folder / "paper" / f"node_label_{classes}.npy"
        edge_path = self.folder / "paper__cites__paper" / "edge_index.npy"
        self._edges = load_npy(edge_path, "edges")
        if self._edges.ndim != 2 or self._edges.shape[1] != 2:
            raise DatasetError(f"{edge_path}: shape {self._edges.shape}, expected (num_edges, 2)")
        self.num_edges = int(self._edges.shape[0])

    def _array(self, path: Path, what: str, dim: int | None) -> np.ndarray:
        """A .npy file, or for large/full a headerless one of N x `dim` (or N) values:
        float32, or float16 when the file is half that size."""
        with open(require_file(path), "rb") as f:
            has_header = f.read(6) == b"\x93NUMPY"
        if has_header:
            array = load_npy(path, what)
        else:
            items = NUM_NODES[self.size] * (dim or 1)
            dtypes = {items * 4: np.float32, items * 2: np.float16}
            dtype = dtypes.get(path.stat().st_size)
            if dtype is None:
                raise DatasetError(f"{path}: {path.stat().st_size} bytes without a .npy header; "
                                   f"expected {items} float32 or float16 values ({what} of the "
                                   f"{NUM_NODES[self.size]} nodes of IGB {self.size})")
            shape = (NUM_NODES[self.size], dim) if dim else (NUM_NODES[self.size],)
            array = np.memmap(path, dtype=dtype, mode="r", shape=shape)
        if array.ndim != (2 if dim else 1):
            raise DatasetError(f"{path}: shape {array.shape}, expected "
                               f"{'(num_nodes, dim)' if dim else '(num_nodes,)'}")
        return array

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self._edges[:, 0]), np.array(self._edges[:, 1])

    def edge_chunks(self, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return mapped_edge_chunks(self._edges, chunk_edges, by_row=False)

    def load_labels(self) -> np.ndarray:
        labels = np.array(self._array(self._label_path, "labels", None), dtype=np.float64)
        if labels.shape != (self.num_nodes,):
            raise DatasetError(f"{self._label_path}: {labels.shape[0]} labels for "
                               f"{self.num_nodes} feature rows")
        labels[self._labelled():] = np.nan
        return labels

    def _labelled(self) -> int:
        return LABELLED_ON_FULL[self.classes] if self.size == "full" else self.num_nodes

    def load_splits(self) -> dict[str, np.ndarray]:
        n = self._labelled()
        train, valid = int(n * 0.6), int(n * 0.2)
        return {"train": np.arange(train), "valid": np.arange(train, train + valid),
                "test": np.arange(train + valid, n)}

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        return slice_chunks(self._features, start_row, chunk_rows)

    def input_paths(self) -> list[Path]:
        """The size's processed folder: every array read: what resume and the --out overlap check see."""
        return [self.folder]

    def describe(self) -> dict[str, Any]:
        return {"kind": "igb", "size": self.size, "classes": self.classes,
                "symmetric": self.symmetric}
