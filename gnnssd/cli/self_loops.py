"""`gnnssd preprocess --self-loops`: a dataset source with an edge v -> v for every node.

DGL's GAT examples add self-loops (`dgl.add_self_loop`) so that a node attends to itself;
in a store the graph is fixed at preprocess time, so they are added there. The store's
topology build drops repeated edges, so a node that already had a self-loop keeps one.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetSource, edge_chunks, edge_count


class WithSelfLoops:
    """`source` (any DatasetSource) with a self-loop added to every node; everything else
    is the source's own."""

    def __init__(self, source: DatasetSource):
        self._source = source

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    @property
    def num_edges(self) -> int:
        """The source's declared edge count plus one loop per node (absent if it declares none)."""
        count = edge_count(self._source)
        if count is None:
            raise AttributeError("num_edges")
        return count + self._source.num_nodes

    def _loops(self) -> np.ndarray:
        return np.arange(self._source.num_nodes, dtype=np.int64)

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        src, dst = (np.asarray(a) for a in self._source.load_edges())
        loops = self._loops()
        return np.concatenate([src, loops.astype(src.dtype)]), np.concatenate([dst, loops.astype(dst.dtype)])

    def edge_chunks(self, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        yield from edge_chunks(self._source, chunk_edges)
        loops = self._loops()
        for lo in range(0, len(loops), chunk_edges):
            yield loops[lo:lo + chunk_edges], loops[lo:lo + chunk_edges]

    def describe(self) -> dict[str, Any]:
        """The source's description, marked: a resumed preprocess must add them too."""
        return {**self._source.describe(), "self_loops": True}
