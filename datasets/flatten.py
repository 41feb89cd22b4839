"""A heterogeneous dataset seen as a homogeneous one: the baseline that forgets relations.

Every relation's edges become plain edges of one graph over the same global node IDs,
and the featureless node types get all-zero feature rows (as a homogeneous GNN must be
given something). Training a homogeneous model on it measures what the relations add.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import TypedSource


class FlattenedSource:
    """`typed` with one node type and one relation (a DatasetSource)."""

    symmetric = False

    def __init__(self, typed: TypedSource):
        self.typed = typed
        self.name = f"{typed.name}-flattened"
        self.num_nodes = typed.schema.num_nodes
        self.feat_dim = typed.feat_dim

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = [self.typed.load_relation_edges(r) for r in range(len(self.typed.schema.relations))]
        return (np.concatenate([np.asarray(s, np.int64) for s, _ in pairs]),
                np.concatenate([np.asarray(d, np.int64) for _, d in pairs]))

    def load_labels(self) -> np.ndarray:
        return self.typed.load_labels()

    def load_splits(self) -> dict[str, np.ndarray]:
        return self.typed.load_splits()

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """The featured rows, then zero rows for the featureless nodes."""
        featured = self.typed.schema.feature_rows
        row = start_row
        if row < featured:
            for chunk in self.typed.feature_chunks(row, chunk_rows):
                yield chunk
                row += len(chunk)
        while row < self.num_nodes:
            count = min(chunk_rows, self.num_nodes - row)
            yield np.zeros((count, self.feat_dim), np.float32)
            row += count

    def describe(self) -> dict[str, Any]:
        return {"flattened": self.typed.describe()}
