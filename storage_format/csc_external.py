"""The CSC built out of core: a bucketed external sort of the edge list by destination.

Pass 1 streams the edges once to count in-degrees (that is indptr, before duplicates are
dropped). The node range is then cut into buckets of consecutive destinations holding at
most `bucket_edges` edges each. Pass 2 streams the edges again and spills every edge to
its bucket's file (source, destination - bucket start). Each bucket is then loaded alone,
counting-sorted by destination, its rows sorted and de-duplicated exactly as the
in-memory build does, and appended to indices.npy. Memory: indptr plus one bucket, not
the edge list; the output is byte-identical to `csc_from_edges` + `np.save`.
"""
from __future__ import annotations

import io
import queue
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import numba
import numpy as np

from .csc import _drop_repeats, _fill_csc, _sort_rows, index_dtype

EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
#: Node IDs a bucket holds per edge in the merge step: the spilled (src, dst) pair and
#: its slot in the bucket's sorted indices.
BUCKET_IDS_PER_EDGE = 3
#: At most this many bucket files open at once (the process's file limit is often 1024):
#: a memory limit too small for it gets larger buckets than it asked for.
MAX_BUCKETS = 256
T = TypeVar("T")


@numba.njit(cache=True, nogil=True)
def _count_degrees(src, dst, symmetric, counts):
    for e in range(src.shape[0]):
        counts[dst[e]] += 1
        if symmetric:
            counts[src[e]] += 1


@numba.njit(cache=True, nogil=True)
def _place(s, d, bounds, pairs, cursor):
    b = np.searchsorted(bounds, d, side="right") - 1
    pairs[cursor[b], 0] = s
    pairs[cursor[b], 1] = d - bounds[b]
    cursor[b] += 1


@numba.njit(cache=True, nogil=True)
def _partition(src, dst, symmetric, bounds, pairs):
    """Write the chunk's edges grouped by bucket into `pairs` (rows: source, destination
    relative to the bucket's first node); returns each bucket's first row (k + 1 offsets)."""
    k = bounds.shape[0] - 1
    offsets = np.zeros(k + 1, dtype=np.int64)
    for e in range(src.shape[0]):
        offsets[np.searchsorted(bounds, dst[e], side="right")] += 1
        if symmetric:
            offsets[np.searchsorted(bounds, src[e], side="right")] += 1
    for b in range(k):
        offsets[b + 1] += offsets[b]
    cursor = offsets[:-1].copy()
    for e in range(src.shape[0]):
        _place(src[e], dst[e], bounds, pairs, cursor)
        if symmetric:
            _place(dst[e], src[e], bounds, pairs, cursor)
    return offsets


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


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """`items`, produced by a background thread up to `depth` ahead: reading and
    decompressing the next chunk overlaps the work on this one (both release the GIL)."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                slots.put(item)
        except BaseException as exc:  # handed to the consumer, raised there
            slots.put(exc)
            return
        slots.put(done)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    try:
        while (item := slots.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                slots.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()


def npy_header(dtype: np.dtype, length: int) -> bytes:
    """The header np.save writes for a 1-D C-order array of `length` items."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (length,)})
    return buffer.getvalue()


def external_csc(chunks: EdgeChunks, num_nodes: int, symmetric: bool, bucket_edges: int,
                 scratch: Path, out: Path, dedupe: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) with indices written to the .npy file `out` and returned mapped.

    `chunks()` must yield the same (src, dst) chunks each time it is called (validated,
    in node range); it is called twice. `scratch` is created and removed.
    """
    dtype = index_dtype(num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    for src, dst in prefetched(chunks()):
        _count_degrees(src, dst, symmetric, indptr[1:])
    np.cumsum(indptr, out=indptr)
    bounds = bucket_bounds(indptr, max(bucket_edges, -(-int(indptr[-1]) // MAX_BUCKETS)))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        paths = [scratch / f"bucket-{b}.bin" for b in range(len(bounds) - 1)]
        _spill(chunks, symmetric, bounds, dtype, paths)
        _merge(paths, bounds, indptr, dtype, out, dedupe)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return indptr, np.load(out, mmap_mode="r")


def _spill(chunks: EdgeChunks, symmetric: bool, bounds: np.ndarray, dtype: np.dtype,
           paths: list[Path]) -> None:
    files = [open(path, "wb") for path in paths]
    try:
        for src, dst in prefetched(chunks()):
            pairs = np.empty((src.shape[0] * (2 if symmetric else 1), 2), dtype=dtype)
            offsets = _partition(src.astype(dtype, copy=False), dst.astype(dtype, copy=False),
                                 symmetric, bounds.astype(dtype), pairs)
            for b, f in enumerate(files):
                if offsets[b + 1] > offsets[b]:
                    f.write(pairs[offsets[b]:offsets[b + 1]].data)
    finally:
        for f in files:
            f.close()


def _merge(paths: list[Path], bounds: np.ndarray, indptr: np.ndarray, dtype: np.dtype,
           out: Path, dedupe: bool) -> None:
    """Sort each bucket in memory and append its rows to `out`; rewrites indptr in place
    to the de-duplicated offsets."""
    header_bytes = len(npy_header(dtype, int(indptr[-1])))
    written = 0
    bucket_start = 0  # the bucket's first offset in the pre-dedupe indptr (being overwritten)
    with open(out, "wb") as f:
        f.seek(header_bytes)
        for b, path in enumerate(paths):
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            local_indptr = indptr[lo:hi + 1].copy()
            local_indptr[0] = bucket_start
            bucket_start = int(local_indptr[-1])
            local_indptr -= local_indptr[0]
            pairs = np.fromfile(path, dtype=dtype).reshape(-1, 2)
            path.unlink()
            rows = np.empty(int(local_indptr[-1]), dtype=dtype)
            _fill_csc(pairs[:, 0], pairs[:, 1], False, local_indptr, rows)
            del pairs
            _sort_rows(local_indptr, rows)
            kept = _drop_repeats(local_indptr, rows) if dedupe else rows.shape[0]
            f.write(rows[:kept].data)
            indptr[lo + 1:hi + 1] = written + local_indptr[1:]
            written += kept
        header = npy_header(dtype, written)
        if len(header) != header_bytes:
            raise AssertionError(f"{out}: .npy header changed length ({header_bytes} -> {len(header)})")
        f.seek(0)
        f.write(header)
        f.flush()
