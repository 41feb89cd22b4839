"""The CSC built out of core: a bucketed external sort of the edge list by destination.

One pass streams the edges: it counts in-degrees (indptr, before duplicates are dropped)
and spills every edge to the file of its bucket of consecutive destinations (source,
destination - bucket start); buckets are equal node ranges, as many as the expected edge
count needs (for an even share of at most SPILL_BUCKET_EDGES each). Each bucket is then loaded alone (one larger than `bucket_edges` is first
split again by its now-known degrees), counting-sorted by destination, its rows sorted and
de-duplicated exactly as the in-memory build does, and appended to indices.npy. Memory:
indptr plus one bucket, not the edge list; the output is byte-identical to
`csc_from_edges` + `np.save`. Resumable: the scratch folder records the finished spill and
every merged bucket, so a killed build continues from the last bucket on disk.
"""
from __future__ import annotations

import os
import queue
import shutil
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, TypeVar

import numba
import numpy as np

from ..atomic import atomic_write_json, writable_file
from .csc import _drop_repeats, _fill_csc, _sort_rows, bucket_bounds, index_dtype
from ..mapping import npy_header
from ..small_files import read_small_json

EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
Progress = Callable[[str, int, int], None]
#: Node IDs a bucket holds per edge in the merge step: the spilled (src, dst) pair and
#: its slot in the bucket's sorted indices.
BUCKET_IDS_PER_EDGE = 3
#: At most this many bucket files open at once (the process's file limit is often 1024):
#: a memory limit too small for it gets larger buckets than it asked for.
MAX_BUCKETS = 256
#: Edges a spill bucket is sized for, at most: small buckets cost nothing (up to MAX_BUCKETS
#: files) and keep the merge's memory well inside the limit.
SPILL_BUCKET_EDGES = 1 << 26
CHUNK_PAIRS = 1 << 22  # edges read at once when a bucket is split again
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


def spill_bounds(num_nodes: int, expected_edges: int | None, bucket_edges: int) -> np.ndarray:
    """Equal node ranges for the spill: enough that an even share of the expected edges
    fits a bucket (at most MAX_BUCKETS; all of them when the count is unknown)."""
    wanted = MAX_BUCKETS if expected_edges is None else -(-expected_edges // max(bucket_edges, 1))
    k = int(min(max(wanted, 1), MAX_BUCKETS, num_nodes))
    return np.unique(np.linspace(0, num_nodes, k + 1).astype(np.int64))


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


def external_csc(chunks: EdgeChunks, num_nodes: int, symmetric: bool,
                 bucket_edges: int | Callable[[], int], scratch: Path, out: Path, dedupe: bool = True,
                 expected_edges: int | None = None,
                 progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) with indices written to the .npy file `out` and returned mapped.

    `bucket_edges`: the most edges one bucket may hold, or a function giving it from the
    memory free at the moment (asked before the spill and again before the merge, when
    the source's own tables are in memory).

    `chunks()` yields (src, dst) chunks (validated, in node range); it is called once, or
    again by a build resumed before its spill finished. `expected_edges` (the stored
    count, reverses included; None: unknown) sizes the spill's buckets. `scratch` holds
    the spill and the resume record, and is removed at the end. `progress(stage, done,
    total)` hears of edges spilled ("sort edges") and buckets merged ("merge buckets").
    """
    notify = progress or (lambda stage, done, total: None)
    limit = bucket_edges if callable(bucket_edges) else (lambda: bucket_edges)
    dtype = index_dtype(num_nodes)
    state = _read_state(scratch)
    if not state.get("spilled"):
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        bounds = spill_bounds(num_nodes, expected_edges, min(limit(), SPILL_BUCKET_EDGES))
        degrees = _spill(chunks, num_nodes, symmetric, bounds, dtype, scratch, expected_edges, notify)
        with writable_file(scratch / DEGREES, scratch) as f:
            np.save(f, degrees)
        state = {"spilled": 1, "bounds": bounds.tolist(), "merged": 0, "written": 0}
        _write_state(scratch, state)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.load(scratch / DEGREES), out=indptr[1:])
    _merge(scratch, state, indptr, dtype, out, dedupe, limit(), notify)
    shutil.rmtree(scratch, ignore_errors=True)
    return indptr, np.load(out, mmap_mode="r")


DEGREES = "degrees.npy"  # in-degrees counted by the spill, before duplicates are dropped
MERGED_DEGREES = "merged-degrees.bin"  # int64 in-degree of every node merged so far
STATE = "state.json"


def _read_state(scratch: Path) -> dict[str, Any]:
    try:
        return read_small_json(scratch / STATE, what="external sort's resume record")
    except (OSError, ValueError):
        return {}


def _write_state(scratch: Path, state: dict[str, Any]) -> None:
    atomic_write_json(scratch / STATE, state)


def _bucket_path(scratch: Path, b: int) -> Path:
    return scratch / f"bucket-{b}.bin"


def _spill(chunks: EdgeChunks, num_nodes: int, symmetric: bool, bounds: np.ndarray,
           dtype: np.dtype, scratch: Path, expected_edges: int | None,
           notify: Progress) -> np.ndarray:
    """Count in-degrees and write every edge to its bucket's file; returns the degrees.
    The files are fsynced: the state written next says they are complete."""
    degrees = np.zeros(num_nodes, dtype=np.int64)
    files = [writable_file(_bucket_path(scratch, b), scratch) for b in range(len(bounds) - 1)]
    copies = 2 if symmetric else 1
    done = 0
    try:
        for src, dst in prefetched(chunks()):
            src, dst = src.astype(dtype, copy=False), dst.astype(dtype, copy=False)
            _count_degrees(src, dst, symmetric, degrees)
            pairs = np.empty((src.shape[0] * copies, 2), dtype=dtype)
            offsets = _partition(src, dst, symmetric, bounds.astype(dtype), pairs)
            _write_groups(files, pairs, offsets)
            done += pairs.shape[0]
            notify("sort edges", done, expected_edges or done)
        for f in files:
            f.flush()
            os.fsync(f.fileno())
    finally:
        for f in files:
            f.close()
    return degrees


def _write_groups(files: list[BinaryIO], pairs: np.ndarray, offsets: np.ndarray) -> None:
    for b, f in enumerate(files):
        if offsets[b + 1] > offsets[b]:
            f.write(pairs[offsets[b]:offsets[b + 1]].data)


def _split_bucket(path: Path, lo: int, sub_bounds: np.ndarray, dtype: np.dtype) -> list[Path]:
    """Re-spill one bucket's file (nodes from `lo`) into the sub-buckets `sub_bounds`."""
    paths = [path.with_name(f"{path.stem}-{s}.bin") for s in range(len(sub_bounds) - 1)]
    files = [writable_file(p, path.parent) for p in paths]
    relative = (sub_bounds - lo).astype(dtype)
    try:
        with open(path, "rb") as f:
            while block := f.read(CHUNK_PAIRS * 2 * dtype.itemsize):
                pairs = np.frombuffer(block, dtype=dtype).reshape(-1, 2)
                out = np.empty_like(pairs)
                _write_groups(files, out, _partition(pairs[:, 0], pairs[:, 1], False, relative, out))
    finally:
        for f in files:
            f.close()
    return paths


def _merge(scratch: Path, state: dict[str, Any], indptr: np.ndarray, dtype: np.dtype,
           out: Path, dedupe: bool, bucket_edges: int, notify: Progress) -> None:
    """Sort each bucket in memory and append its rows to `out`, recording each bucket
    once on disk; rewrites indptr in place to the de-duplicated offsets."""
    bounds = np.asarray(state["bounds"], dtype=np.int64)
    total = int(indptr[-1])
    header_bytes = len(npy_header(dtype, total))
    first, written = int(state["merged"]), int(state["written"])
    with (writable_file(out, out.parent, header_bytes + written * dtype.itemsize) as f,
          writable_file(scratch / MERGED_DEGREES, scratch, int(bounds[first]) * 8) as deg):
        for b in range(first, len(bounds) - 1):
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            path = _bucket_path(scratch, b)
            parts = [(lo, hi, path)]
            if indptr[hi] - indptr[lo] > bucket_edges:
                sub = bucket_bounds(indptr[lo:hi + 1] - indptr[lo], bucket_edges) + lo
                parts = list(zip(sub[:-1].tolist(), sub[1:].tolist(), _split_bucket(path, lo, sub, dtype)))
            for part_lo, part_hi, part in parts:
                rows, kept_indptr = _sorted_bucket(part, indptr[part_lo:part_hi + 1], dtype, dedupe)
                f.write(rows.data)
                deg.write(np.diff(kept_indptr).astype("<i8").data)
                written += rows.shape[0]
            for part_lo, part_hi, part in parts:
                part.unlink(missing_ok=True)
            f.flush()
            deg.flush()
            os.fsync(f.fileno())
            os.fsync(deg.fileno())
            state.update(merged=b + 1, written=written)
            _write_state(scratch, state)
            path.unlink(missing_ok=True)
            notify("merge buckets", b + 1, len(bounds) - 1)
        header = npy_header(dtype, written)
        if len(header) != header_bytes:
            raise AssertionError(f"{out}: .npy header changed length ({header_bytes} -> {len(header)})")
        f.seek(0)
        f.write(header)
        f.flush()
        os.fsync(f.fileno())
    merged = np.fromfile(scratch / MERGED_DEGREES, dtype="<i8")
    indptr[0] = 0
    np.cumsum(merged, out=indptr[1:])


def _sorted_bucket(path: Path, bucket_indptr: np.ndarray, dtype: np.dtype,
                   dedupe: bool) -> tuple[np.ndarray, np.ndarray]:
    """The bucket's rows, sorted (and de-duplicated), with their offsets from 0."""
    local_indptr = bucket_indptr - bucket_indptr[0]
    pairs = np.fromfile(path, dtype=dtype).reshape(-1, 2)
    rows = np.empty(int(local_indptr[-1]), dtype=dtype)
    _fill_csc(pairs[:, 0], pairs[:, 1], False, local_indptr, rows)
    del pairs
    _sort_rows(local_indptr, rows)
    kept = _drop_repeats(local_indptr, rows) if dedupe else rows.shape[0]
    return rows[:kept], local_indptr
