"""NumPy arrays (or memmaps) handed over through the Python API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError

from .base import slice_chunks


@dataclass
class ArraySource:
    """A dataset held by the caller: features may be an np.memmap larger than memory.

    `edges` is (src, dst) or an (E, 2) array; `splits` maps 'train'/'valid'/'test' to
    node IDs.
    """

    features: np.ndarray
    edges: Any
    labels: np.ndarray
    splits: dict[str, np.ndarray]
    name: str = "arrays"
    symmetric: bool = False
    _edges: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if getattr(self.features, "ndim", None) != 2:
            raise DatasetError(f"{self.name}: features must be a 2-D array (nodes, dim), got "
                               f"shape {getattr(self.features, 'shape', None)}")
        self._edges = _as_edge_pair(self.edges, self.name)
        n = self.features.shape[0]
        if np.shape(self.labels)[0] != n:
            raise DatasetError(f"{self.name}: {np.shape(self.labels)[0]} labels for {n} feature "
                               "rows; expected one label per node")
        self.num_nodes = n
        self.feat_dim = int(self.features.shape[1])

    @property
    def num_edges(self) -> int:
        return int(self._edges[0].shape[0])

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        return self._edges

    def load_labels(self) -> np.ndarray:
        return np.asarray(self.labels)

    def load_splits(self) -> dict[str, np.ndarray]:
        return self.splits

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        return slice_chunks(self.features, start_row, chunk_rows)

    def describe(self) -> dict[str, Any]:
        return {"kind": "arrays", "name": self.name, "num_nodes": self.num_nodes,
                "feat_dim": self.feat_dim, "num_edges": self.num_edges,
                "symmetric": self.symmetric}


def _as_edge_pair(edges: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(edges, tuple) and len(edges) == 2:
        return np.asarray(edges[0]), np.asarray(edges[1])
    array = np.asarray(edges)
    if array.ndim == 2 and array.shape[1] == 2:
        return array[:, 0], array[:, 1]
    if array.ndim == 2 and array.shape[0] == 2:
        return array[0], array[1]
    raise DatasetError(f"{name}: edges have shape {array.shape}; expected (src, dst), (E, 2) "
                       "or (2, E)")
