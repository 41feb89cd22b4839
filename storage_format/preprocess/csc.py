"""Compressed sparse column topology: building it from edge lists and renumbering it.

The store keeps in-edges per node (CSC): the sources of node v are
indices[indptr[v]:indptr[v+1]], sorted. That is what neighbour sampling reads, and
what DGL's in-edge sampler samples from.
"""
from __future__ import annotations

import contextlib

import os
from pathlib import Path
from typing import Callable

import numba
import numpy as np

from ..atomic import writable_file
from ..mapping import npy_header, release_pages
from ..schema import ONE_RELATION


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


#: Window files of an out-of-core renumbering, at most (files open at once).
MAX_WINDOWS = 256


@numba.njit(cache=True, nogil=True)
def _degrees_in_new_order(indptr, perm, out):
    out[0] = 0
    for k in range(perm.shape[0]):
        out[k + 1] = out[k] + indptr[perm[k] + 1] - indptr[perm[k]]


def _renumbered_indptr(indptr: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """The indptr in perm's order, in one pass (no node-sized temporaries)."""
    new_indptr = np.empty_like(indptr)
    _degrees_in_new_order(indptr, perm, new_indptr)
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


@numba.njit(cache=True, nogil=True)
def _group_by_window(indptr, indices, inv, etypes, first, last, window, out, starts):
    """The renumbered sources of old rows first..last-1 (with `etypes` non-empty: the key
    relation * N + source), grouped by the window of each row's new position (window[k]
    for row first + k), rows in old order inside a group; `starts` (windows + 1) receives
    each group's offset in `out`."""
    starts[:] = 0
    for v in range(first, last):
        starts[window[v - first] + 1] += indptr[v + 1] - indptr[v]
    for w in range(starts.shape[0] - 1):
        starts[w + 1] += starts[w]
    cursor = starts[:-1].copy()
    n = indptr.shape[0] - 1
    typed = etypes.shape[0] > 0
    for v in range(first, last):
        w = window[v - first]
        for e in range(indptr[v], indptr[v + 1]):
            if typed:
                out[cursor[w]] = np.int64(etypes[e]) * n + inv[indices[e]]
            else:
                out[cursor[w]] = inv[indices[e]]
            cursor[w] += 1


@numba.njit(parallel=True, cache=True, nogil=True)
def _place_rows(rows, indptr, new_start, data, out):
    """Old rows `rows` (ascending, their sources back to back in `data`) written sorted at
    out[new_start[k]:...] (each row's new offset within the window)."""
    offsets = np.empty(rows.shape[0] + 1, np.int64)
    offsets[0] = 0
    for k in range(rows.shape[0]):
        offsets[k + 1] = offsets[k] + indptr[rows[k] + 1] - indptr[rows[k]]
    for k in numba.prange(rows.shape[0]):
        d = offsets[k + 1] - offsets[k]
        o = new_start[k]
        out[o:o + d] = np.sort(data[offsets[k]:offsets[k + 1]])


def renumber_key_dtype(indices: np.ndarray, etypes_out: Path | None) -> np.dtype:
    """The dtype of renumber_csc_to_file's window keys: the sources' own, or with
    `etypes_out` int64 keys relation * N + source."""
    return indices.dtype if etypes_out is None else np.dtype(np.int64)


def renumber_csc_to_file(indptr: np.ndarray, indices: np.ndarray, perm: np.ndarray,
                         inv: np.ndarray, out: Path, chunk_edges: int,
                         progress: Callable[[int, int], None], etypes: np.ndarray = ONE_RELATION,
                         etypes_out: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`renumber_csc` with the new indices written to the .npy file `out` (returned
    mapped), in two sequential passes, as the feature rows are reordered: the new rows are
    cut into windows of about `chunk_edges` edges; pass 1 reads the old indices in order
    and appends each row, renumbered, to its window's file (beside `out`); pass 2 sorts
    each window's rows into place and appends the window to `out`. Memory: indptr, inv and
    a chunk; the old indices' mapped pages are released after every chunk (random reads of
    old rows would keep the whole file resident). `inv` in the indices' dtype costs no copy.

    With `etypes_out`, `etypes` is a typed graph's relation of every edge: each row is
    sorted by (relation, new source), as the typed topology keeps it, and the relations are
    written to `etypes_out`: the window files then hold relation * N + source as int64."""
    n = indptr.shape[0] - 1
    new_indptr = _renumbered_indptr(indptr, perm)
    total = int(new_indptr[-1])
    chunk_edges = max(chunk_edges, -(-total // MAX_WINDOWS), 1)
    bounds = bucket_bounds(new_indptr, chunk_edges)
    windows = len(bounds) - 1
    for stale in out.parent.glob(f"{out.name}.window-*"):  # of an interrupted attempt
        stale.unlink()
    paths = [out.with_name(f"{out.name}.window-{w}") for w in range(windows)]
    small_inv = inv if inv.dtype == indices.dtype else inv.astype(indices.dtype)
    key_dtype = renumber_key_dtype(indices, etypes_out)
    old_bounds = bucket_bounds(np.asarray(indptr), chunk_edges)
    steps = len(old_bounds) - 1 + windows
    files = [writable_file(path, out.parent) for path in paths]
    try:
        starts = np.empty(windows + 1, np.int64)
        for k, (lo, hi) in enumerate(zip(old_bounds[:-1].tolist(), old_bounds[1:].tolist())):
            window = np.searchsorted(bounds, small_inv[lo:hi], side="right") - 1
            grouped = np.empty(int(indptr[hi] - indptr[lo]), dtype=key_dtype)
            _group_by_window(indptr, indices, small_inv, etypes, lo, hi, window, grouped, starts)
            for w in np.flatnonzero(np.diff(starts)).tolist():
                files[w].write(grouped[starts[w]:starts[w + 1]].data)
            release_pages(indices)
            release_pages(etypes)
            progress(k + 1, steps)
    finally:
        for f in files:
            f.close()
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(writable_file(out, out.parent))
        f.write(npy_header(indices.dtype, total))
        g = None
        if etypes_out is not None:
            g = stack.enter_context(writable_file(etypes_out, etypes_out.parent))
            g.write(npy_header(etypes.dtype, total))
        for w, path in enumerate(paths):
            lo, hi = int(bounds[w]), int(bounds[w + 1])
            # the window's old rows ascending (the order of its file) and their new positions
            by_old = np.argsort(perm[lo:hi], kind="stable")
            rows = np.asarray(perm[lo:hi])[by_old]
            part = np.empty(int(new_indptr[hi] - new_indptr[lo]), dtype=key_dtype)
            _place_rows(rows, np.asarray(indptr), new_indptr[lo + by_old] - new_indptr[lo],
                        np.fromfile(path, dtype=key_dtype), part)
            if g is None:
                f.write(part.data)
            else:
                f.write((part % n).astype(indices.dtype).data)
                g.write((part // n).astype(etypes.dtype).data)
            path.unlink()
            progress(len(old_bounds) - 1 + w + 1, steps)
        for written in (f, g):
            if written is not None:
                written.flush()
                os.fsync(written.fileno())
    return new_indptr, np.load(out, mmap_mode="r")
