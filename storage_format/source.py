"""What preprocess reads from: one interface that every dataset format implements."""
from __future__ import annotations

from typing import Any, Iterator, Protocol

import numpy as np


class DatasetSource(Protocol):
    """A node-classification dataset in its original node IDs.

    Features are streamed in row order so that no source has to hold the feature
    matrix; everything else (edges, labels, splits) is held in memory.
    """

    name: str
    num_nodes: int
    feat_dim: int
    #: Add the reverse of every edge (for formats that list each undirected edge once).
    symmetric: bool

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) int64 arrays; an edge src -> dst makes src a neighbour of dst."""

    def load_labels(self) -> np.ndarray:
        """One integer class per node; -1 marks an unlabelled node."""

    def load_splits(self) -> dict[str, np.ndarray]:
        """Node IDs of 'train', 'valid' and 'test'."""

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """Consecutive blocks of feature rows, the first beginning at `start_row`."""

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters that identify this input (recorded in the manifest)."""

    # Optional: `input_paths() -> list[Path]`, the files or folders the source reads.
    # Preprocess keys its resume on their identity and never writes a store inside them.
