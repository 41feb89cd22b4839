"""Compressed sparse column topology: building it from edge lists and renumbering it.

The store keeps in-edges per node (CSC): the sources of node v are
indices[indptr[v]:indptr[v+1]], sorted. That is what neighbour sampling reads, and
what DGL's in-edge sampler samples from.
"""
from __future__ import annotations

import numba
import numpy as np


def index_dtype(num_nodes: int) -> np.dtype:
    """int32 node IDs when they fit: halves the topology's memory."""
    return np.dtype(np.int32) if num_nodes < 2**31 - 1 else np.dtype(np.int64)


@numba.njit(cache=True)
def _fill_csc(src, dst, symmetric, indptr, indices):
    cursor = indptr[:-1].copy()
    for e in range(src.shape[0]):
        s, d = src[e], dst[e]
        indices[cursor[d]] = s
        cursor[d] += 1
        if symmetric:
            indices[cursor[s]] = d
            cursor[s] += 1


@numba.njit(parallel=True, cache=True)
def _sort_rows(indptr, indices):
    for v in numba.prange(indptr.shape[0] - 1):
        indices[indptr[v]:indptr[v + 1]] = np.sort(indices[indptr[v]:indptr[v + 1]])


@numba.njit(cache=True)
def _drop_repeats(indptr, indices):
    """Remove repeated sources within each (sorted) row, compacting in place."""
    out = 0
    start = indptr[0]
    for v in range(indptr.shape[0] - 1):
        end = indptr[v + 1]
        for e in range(start, end):
            if e == start or indices[e] != indices[e - 1]:
                indices[out] = indices[e]
                out += 1
        start = end
        indptr[v + 1] = out
    return out


def csc_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int, symmetric: bool = False,
                   dedupe: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Counting-sort edges (src -> dst, and dst -> src if `symmetric`) by destination.

    O(E) time, and no memory beyond the output: no E-sized sort keys, no copy of the
    edge list for the reverse direction, duplicates squeezed out in place.
    """
    counts = np.bincount(dst, minlength=num_nodes).astype(np.int64)
    if symmetric:
        counts += np.bincount(src, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    del counts
    indices = np.empty(int(indptr[-1]), dtype=index_dtype(num_nodes))
    _fill_csc(src, dst, symmetric, indptr, indices)
    _sort_rows(indptr, indices)
    if dedupe:
        kept = _drop_repeats(indptr, indices)
        if kept < indices.shape[0]:
            indices = indices[:kept].copy()
    return indptr, indices


@numba.njit(parallel=True, cache=True)
def _renumber(indptr, indices, perm, inv, new_indptr, new_indices):
    n = perm.shape[0]
    for u in numba.prange(n):
        old = perm[u]
        lo, hi = indptr[old], indptr[old + 1]
        out = new_indptr[u]
        for k in range(hi - lo):
            new_indices[out + k] = inv[indices[lo + k]]
        new_indices[out:out + hi - lo] = np.sort(new_indices[out:out + hi - lo])


def renumber_csc(indptr: np.ndarray, indices: np.ndarray, perm: np.ndarray,
                 inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same graph with node perm[u] renamed u (inv is perm's inverse)."""
    degrees = np.diff(indptr)[perm]
    new_indptr = np.zeros_like(indptr)
    np.cumsum(degrees, out=new_indptr[1:])
    new_indices = np.empty_like(indices)
    _renumber(indptr, indices, perm.astype(np.int64), inv.astype(indices.dtype),
              new_indptr, new_indices)
    return new_indptr, new_indices
