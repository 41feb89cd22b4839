"""What preprocess reads from: one interface that every dataset format implements."""
from __future__ import annotations

from typing import Any, Iterator, Protocol

import numpy as np

from ..schema import GraphSchema


class DatasetSource(Protocol):
    """A node-classification dataset in its original node IDs.

    Features are streamed in row order so that no source has to hold the feature
    matrix; labels and splits are held in memory. Edges are either loaded whole
    (`load_edges`) or, by sources that also define `num_edges` and
    `edge_chunks(chunk_edges)`, streamed: see `edge_chunks` below.
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


class TypedSource(DatasetSource, Protocol):
    """A heterogeneous dataset: a DatasetSource whose nodes are typed by `schema` (node IDs
    global: type t's node i is `schema.offsets[t] + i`) and whose edges come per relation.

    `num_nodes` is `schema.num_nodes`; `feature_chunks` yields the rows of the featured
    types only (`schema.feature_rows` rows, all of dim `feat_dim`); `load_labels` covers
    every node (-1 outside the target type) and the splits hold global IDs of target
    nodes. `load_edges` is not used.
    """

    schema: GraphSchema

    def load_relation_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) global node IDs of the edges of `schema.relations[relation]`."""

    # Optional, for relations too large to load whole: `relation_edge_chunks(relation)`
    # yields the same edges as consecutive (src, dst) chunks, and
    # `relation_edge_count(relation) -> int` says how many there are; the out-of-core
    # typed build then streams the relation.


def schema_of(source: DatasetSource) -> GraphSchema:
    """The source's schema; a plain DatasetSource is one node type and one relation."""
    return getattr(source, "schema", None) or GraphSchema.homogeneous(source.num_nodes)


def edge_count(source: DatasetSource) -> int | None:
    """The number of edges a streaming source declares (None: it only loads them whole)."""
    count = getattr(source, "num_edges", None)
    return None if count is None else int(count)


def edge_chunks(source: DatasetSource, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The source's edges as consecutive (src, dst) chunks of up to `chunk_edges`: its own
    `edge_chunks` stream when it has one, else slices of `load_edges()`."""
    stream = getattr(source, "edge_chunks", None)
    if stream is not None:
        yield from stream(chunk_edges)
        return
    yield from sliced_edges(*(np.asarray(a) for a in source.load_edges()), chunk_edges)


def sliced_edges(src: np.ndarray, dst: np.ndarray, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) as consecutive chunks of up to `chunk_edges` (arrays of other shapes as
    they are, for the caller's checks to report)."""
    if src.shape != dst.shape or src.ndim != 1:
        yield src, dst
        return
    for lo in range(0, src.shape[0], chunk_edges):
        yield src[lo:lo + chunk_edges], dst[lo:lo + chunk_edges]
