"""The blocks of layer-wise inference (gnnssd.inference.layerwise): chunks of destination nodes
within the memory budget, a chunk over all its in-edges as a DGL block on a homogeneous
store or a DGL heterogeneous block on a typed one (its CSC with the relation of each edge,
etypes.npy), and which node types each layer of a typed model must be computed for.
"""
from __future__ import annotations

import dgl
import numpy as np
import torch

from gnnssd.storage_format import GraphSchema, Store

from .mean import cost_ranges

CHUNK_SHARE = 8  # a chunk's input rows take at most 1/CHUNK_SHARE of the budget


def chunk_bounds(indptr: np.ndarray, row_bytes: int, budget: int) -> list[tuple[int, int]]:
    """Destination ranges [lo, hi) in store order whose nodes plus in-edges, as rows of
    row_bytes, fit budget // CHUNK_SHARE (at least one node each)."""
    limit = max(budget // CHUNK_SHARE // max(row_bytes, 1), 1)
    # a chunk [lo, hi) needs at most (hi - lo) + (indptr[hi] - indptr[lo]) rows
    return cost_ranges(np.arange(len(indptr), dtype=np.int64) + np.asarray(indptr, np.int64), limit)


def source_positions(nbrs: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """A block's sources for in-neighbours `nbrs` of destinations lo..hi-1 (the
    destinations first, as DGL blocks have them, then the other in-neighbours sorted), and
    each in-neighbour's position among them. lo == hi: the in-neighbours only."""
    inside = (nbrs >= lo) & (nbrs < hi)
    extra = np.unique(nbrs[~inside])
    positions = np.where(inside, nbrs - lo, (hi - lo) + np.searchsorted(extra, nbrs))
    return positions, np.concatenate([np.arange(lo, hi, dtype=np.int64), extra])


def chunk_block(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int) -> tuple[dgl.DGLGraph, np.ndarray]:
    """The block of destinations lo..hi-1 over all their in-neighbours, and its source
    node IDs."""
    a, b = int(indptr[lo]), int(indptr[hi])
    src_local, src = source_positions(np.asarray(indices[a:b], np.int64), lo, hi)
    dst_local = np.repeat(np.arange(hi - lo), np.diff(np.asarray(indptr[lo:hi + 1], np.int64)))
    block = dgl.create_block((torch.from_numpy(src_local), torch.from_numpy(dst_local)),
                             num_src_nodes=len(src), num_dst_nodes=hi - lo)
    return block, src


def typed_chunk_block(store: Store, lo: int, hi: int) -> tuple[dgl.DGLGraph, dict[str, np.ndarray]]:
    """The heterogeneous block of destinations lo..hi-1 (store IDs of one node type) over
    all their in-edges, every relation of the schema present (empty ones too, as DGL's
    sampler gives them), and its source nodes of each type by type-local ID (the
    destinations first in their own type)."""
    schema = store.schema
    offsets = schema.offsets
    dst_type = int(schema.type_of(np.array([lo]))[0])
    a, b = int(store.indptr[lo]), int(store.indptr[hi])
    nbrs = np.asarray(store.indices[a:b], np.int64)
    relation = np.asarray(store.etypes[a:b], np.int64)
    src_type = np.array([schema.type_id(s) for s, _, _ in schema.relations], np.int64)[relation]
    dst_local = np.repeat(np.arange(hi - lo), np.diff(np.asarray(store.indptr[lo:hi + 1], np.int64)))
    src_local = np.empty(len(nbrs), np.int64)
    sources = {}
    for t, name in enumerate(schema.type_names):
        mine = src_type == t
        own = (lo, hi) if t == dst_type else (0, 0)
        src_local[mine], ids = source_positions(nbrs[mine], *own)
        sources[name] = ids - offsets[t]
    edges = {rel: (torch.from_numpy(src_local[relation == r]), torch.from_numpy(dst_local[relation == r]))
             for r, rel in enumerate(schema.relations)}
    block = dgl.create_block(edges, num_src_nodes={name: len(ids) for name, ids in sources.items()},
                             num_dst_nodes={name: hi - lo if t == dst_type else 0
                                            for t, name in enumerate(schema.type_names)})
    return block, sources


def input_types(schema: GraphSchema, types: list[int]) -> list[int]:
    """The node types a layer reads for destinations of `types`: those types (a
    destination's own row) and the source types of the relations into them."""
    sources = {schema.type_id(s) for s, _, d in schema.relations if schema.type_id(d) in types}
    return sorted((set(types) | sources) - _empty(schema))


def layer_types(schema: GraphSchema, layers: int) -> list[list[int]]:
    """The node types each of `layers` layers computes outputs for: the target type at the
    last; before, the types the next layer reads (types without nodes left out)."""
    needed = [[schema.type_id(schema.target)]]
    for _ in range(layers - 1):
        needed.insert(0, input_types(schema, needed[0]))
    return needed


def _empty(schema: GraphSchema) -> set[int]:
    return {t for t, node_type in enumerate(schema.node_types) if node_type.count == 0}
