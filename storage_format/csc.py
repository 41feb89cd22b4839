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
def _fill_csc(src, dst, indptr, indices):
    cursor = indptr[:-1].copy()
    for e in range(src.shape[0]):
        d = dst[e]
        indices[cursor[d]] = src[e]
        cursor[d] += 1


@numba.njit(parallel=True, cache=True)
def _sort_and_dedupe_rows(indptr, indices, dedupe, keep):
    """Sort each node's sources; mark duplicates (keep[e] = False) when `dedupe`."""
    n = indptr.shape[0] - 1
    for v in numba.prange(n):
        lo, hi = indptr[v], indptr[v + 1]
        indices[lo:hi] = np.sort(indices[lo:hi])
        if dedupe:
            for e in range(lo + 1, hi):
                if indices[e] == indices[e - 1]:
                    keep[e] = False


def csc_from_edges(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                   dedupe: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Counting-sort edges (src -> dst) by destination: O(E) time, no E-sized sort keys."""
    counts = np.bincount(dst, minlength=num_nodes).astype(np.int64)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.empty(src.shape[0], dtype=index_dtype(num_nodes))
    _fill_csc(src, dst, indptr, indices)
    keep = np.ones(indices.shape[0], dtype=np.bool_)
    _sort_and_dedupe_rows(indptr, indices, dedupe, keep)
    if not keep.all():
        row_of_edge = np.repeat(np.arange(num_nodes), np.diff(indptr))
        kept_per_row = np.bincount(row_of_edge[keep], minlength=num_nodes)
        indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(kept_per_row, out=indptr[1:])
        indices = indices[keep]
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
