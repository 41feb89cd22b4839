"""The topology of a heterogeneous graph: one CSC over all node types plus the relation
of every edge (see storage_format.schema).

Each relation's edges become a CSC of their own (the homogeneous builder), checked against
the relation's source and destination types; the per-relation CSCs are then interleaved
node by node, so each node's in-edges are grouped by relation (in the schema's order) and
sorted by source within a relation: the sampler finds a relation's neighbours of a node
as one contiguous run. A store in another node order is built the same way from the
relabelled endpoints, so the grouping and sorting hold in the store's IDs.
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from .csc import csc_from_edges, index_dtype
from .errors import DatasetError
from .link_split import LinkSplit, held_out_mask
from .schema import GraphSchema
from .source import TypedSource

Notify = Callable[[str, int, int], None]


@numba.njit(cache=True)
def _interleave(indptrs, cat, starts, out_indptr, out_indices, out_etypes):
    """Node v's in-edges: relation 0's run, then relation 1's, ... (from `cat`, the
    relations' indices concatenated, relation r's starting at starts[r])."""
    num_rel = indptrs.shape[0]
    for v in range(out_indptr.shape[0] - 1):
        o = out_indptr[v]
        for r in range(num_rel):
            for e in range(indptrs[r, v], indptrs[r, v + 1]):
                out_indices[o] = cat[starts[r] + e]
                out_etypes[o] = r
                o += 1


def checked_relation_edges(source: TypedSource, schema: GraphSchema, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Relation r's (src, dst), checked: integer 1-D arrays of equal length whose ends
    are nodes of the relation's source and destination types (in the index dtype)."""
    offsets = schema.offsets
    src_type, name, dst_type = schema.relations[r]
    src, dst = (np.asarray(a) for a in source.load_relation_edges(r))
    if src.shape != dst.shape or src.ndim != 1:
        raise DatasetError(f"{source.name}: relation {name!r} has endpoint arrays of shapes "
                           f"{src.shape} and {dst.shape}, expected two equal 1-D arrays")
    for side, ends, ntype in (("source", src, src_type), ("destination", dst, dst_type)):
        if ends.size and ends.dtype.kind not in "iu":
            raise DatasetError(f"{source.name}: relation {name!r} edge {side}s have dtype "
                               f"{ends.dtype}, expected integers")
        t = schema.type_id(ntype)
        lo, hi = offsets[t], offsets[t + 1]
        bad = np.flatnonzero((ends < lo) | (ends >= hi))
        if bad.size:
            raise DatasetError(f"{source.name}: relation {name!r} edge {bad[0]} has {side} "
                               f"{ends[bad[0]]}, not a {ntype!r} node ({lo}..{hi - 1})")
    dtype = index_dtype(schema.num_nodes)
    return src.astype(dtype, copy=False), dst.astype(dtype, copy=False)


def _check_fits(source: TypedSource, needed: int, memory_limit: int, what: str) -> None:
    if needed > memory_limit:
        raise DatasetError(f"{source.name}: the heterogeneous topology is built in memory ({what} "
                           f"needs about {needed / 2**30:.2f} GiB), more than --memory-limit "
                           f"{memory_limit / 2**30:.2f} GiB; raise --memory-limit (a typed topology "
                           "is not sorted out of core yet)")


def _kept(edges: tuple[np.ndarray, np.ndarray], n: int, link: LinkSplit | None) -> tuple[np.ndarray, np.ndarray]:
    """The edges minus the link split's held-out pairs (either direction), if any."""
    if link is None:
        return edges
    kept = ~held_out_mask(*edges, n, link)
    return edges[0][kept], edges[1][kept]


def typed_csc(source: TypedSource, notify: Notify, memory_limit: int | None = None,
              relabel: list[np.ndarray] | None = None,
              link: LinkSplit | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, indices, etypes) of the source's graph in its own node IDs, or with
    `relabel` ([store_id], store_id[v] of every source ID v, in the index dtype) in
    those; repeated edges of one relation are kept once, the same pair in two relations
    once per relation; the valid and test pairs of `link` (source IDs) are left out of
    every relation, both directions. Built in memory: refused (before the step that would
    pass it) when it needs more than `memory_limit` bytes. The relabelling is taken out of
    its list once the relations are read, so it is gone before the interleave's peak."""
    schema = source.schema
    n = schema.num_nodes
    limit = memory_limit or np.iinfo(np.int64).max
    store_id = relabel.pop() if relabel else None
    relabel_bytes = 0 if store_id is None else store_id.nbytes
    _check_fits(source, len(schema.relations) * (n + 1) * 8 + relabel_bytes, limit, "the relations' offsets")
    indptrs = np.zeros((len(schema.relations), n + 1), np.int64)
    parts = []
    for r in range(len(schema.relations)):
        src, dst = _kept(checked_relation_edges(source, schema, r), n, link)
        if store_id is not None:
            src, dst = store_id[src], store_id[dst]
        indptr, indices = csc_from_edges(src, dst, n)
        del src, dst
        indptrs[r] = indptr
        parts.append(indices)
        notify("relations", r + 1, len(schema.relations))
    del store_id
    edges = sum(len(p) for p in parts)
    index_bytes = index_dtype(n).itemsize
    _check_fits(source, indptrs.nbytes + edges * (2 * index_bytes + schema.etype_dtype().itemsize), limit,
                f"interleaving {edges:,} edges")
    starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    cat = np.concatenate(parts)  # a schema has at least one relation
    del parts
    out_indptr = indptrs.sum(axis=0)
    out_indices = np.empty(cat.shape[0], cat.dtype)
    out_etypes = np.empty(cat.shape[0], schema.etype_dtype())
    _interleave(indptrs, cat, starts, out_indptr, out_indices, out_etypes)
    return out_indptr, out_indices, out_etypes
