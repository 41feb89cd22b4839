"""Compressed sparse column topology: building it from edge lists and renumbering it.

The store keeps in-edges per node (CSC): the sources of node v are
indices[indptr[v]:indptr[v+1]], sorted. That is what neighbour sampling reads, and
what DGL's in-edge sampler samples from.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numba
import numpy as np

from .mapping import npy_header, release_pages


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


@numba.njit(parallel=True, cache=True, nogil=True)
def _renumber_rows(indptr, indices, rows, inv, out_indptr, out):
    """out[out_indptr[k]:out_indptr[k+1]] = sorted inv[sources of old node rows[k]]."""
    for k in numba.prange(rows.shape[0]):
        old = rows[k]
        lo, hi = indptr[old], indptr[old + 1]
        start = out_indptr[k]
        for j in range(hi - lo):
            out[start + j] = inv[indices[lo + j]]
        out[start:start + hi - lo] = np.sort(out[start:start + hi - lo])


def _renumbered_indptr(indptr: np.ndarray, perm: np.ndarray) -> np.ndarray:
    new_indptr = np.zeros_like(indptr)
    np.cumsum(np.diff(indptr)[perm], out=new_indptr[1:])
    return new_indptr


def renumber_csc(indptr: np.ndarray, indices: np.ndarray, perm: np.ndarray,
                 inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same graph with node perm[u] renamed u (inv is perm's inverse)."""
    new_indptr = _renumbered_indptr(indptr, perm)
    new_indices = np.empty_like(indices)
    _renumber_rows(indptr, indices, perm.astype(np.int64), inv.astype(indices.dtype),
                   new_indptr, new_indices)
    return new_indptr, new_indices


def bucket_bounds(indptr: np.ndarray, bucket_edges: int) -> np.ndarray:
    """Node boundaries 0 = b0 < b1 < ... = N such that each bucket [b_i, b_i+1) holds at
    most `bucket_edges` edges, or is a single node."""
    n = indptr.shape[0] - 1
    bounds = [0]
    while bounds[-1] < n:
        lo = bounds[-1]
        hi = int(np.searchsorted(indptr, indptr[lo] + bucket_edges, side="right")) - 1
        bounds.append(min(max(hi, lo + 1), n))
    return np.asarray(bounds, dtype=np.int64)


def renumber_csc_to_file(indptr: np.ndarray, indices: np.ndarray, perm: np.ndarray,
                         inv: np.ndarray, out: Path, chunk_edges: int,
                         progress: Callable[[int, int], None]) -> tuple[np.ndarray, np.ndarray]:
    """`renumber_csc` with the new indices written to the .npy file `out` (returned
    mapped), a chunk of about `chunk_edges` at a time: memory is indptr, inv and one
    chunk, and the old indices' mapped pages are released after every chunk."""
    new_indptr = _renumbered_indptr(indptr, perm)
    small_inv = inv.astype(indices.dtype)
    bounds = bucket_bounds(new_indptr, chunk_edges)
    with open(out, "wb") as f:
        f.write(npy_header(indices.dtype, int(new_indptr[-1])))
        for k, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
            part = np.empty(int(new_indptr[hi] - new_indptr[lo]), dtype=indices.dtype)
            _renumber_rows(indptr, indices, perm[lo:hi].astype(np.int64), small_inv,
                           new_indptr[lo:hi + 1] - new_indptr[lo], part)
            f.write(part.data)
            release_pages(indices)
            progress(k + 1, len(bounds) - 1)
        f.flush()
        os.fsync(f.fileno())
    return new_indptr, np.load(out, mmap_mode="r")
