"""The row reader: rows of a fixed-stride file (row r at r * row_bytes) read by page-aligned
extents into a staging area and copied out in C.

Which extents cover the rows (one per row, or merged runs) is the read planner's choice
(gnnssd.sampler.readplan): the reader takes them as given. The extents are read in chunks
of at most half the staging area, the next chunk's reads in flight while the current
chunk's rows are copied out.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ._gnnssd_io import ffi, lib

if TYPE_CHECKING:
    from .engine import Engine, EngineFile, Handle


def _ptr(arr: np.ndarray | None, ctype: str = "int64_t[]") -> Any:
    return ffi.NULL if arr is None else ffi.from_buffer(ctype, arr)


def copy_rows(src: np.ndarray, pos: np.ndarray, row_bytes: int, out: np.ndarray,
              order: np.ndarray | None = None) -> None:
    """out[k] = src[pos[k]:+row_bytes] (out[order[k]] with `order`): src 1-D uint8, out
    C-contiguous rows of row_bytes. One memcpy per row in C, the GIL released."""
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if len(pos) and (pos.min() < 0 or pos.max() + row_bytes > len(src)):
        raise ValueError(f"a row position lies outside the {len(src)}-byte source")
    dest = out.view(np.uint8).reshape(-1)
    rows_out = len(dest) // row_bytes if row_bytes else 0
    if order is not None and len(order) != len(pos):
        raise ValueError(f"order has {len(order)} entries for {len(pos)} rows")
    last = len(pos) - 1 if order is None or not len(order) else int(order.max())
    if last >= rows_out:
        raise ValueError(f"out holds {rows_out} rows of {row_bytes} bytes, row {last} is copied")
    lib.gio_rows_copy(_ptr(src, "uint8_t[]"), _ptr(pos), _ptr(order), len(pos), row_bytes,
                      _ptr(dest, "uint8_t[]"))


def _check_rows(f: EngineFile, rows: Any, row_bytes: int) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 1:
        raise ValueError(f"rows must be a 1-D array, got shape {rows.shape}")
    if rows.size and not np.issubdtype(rows.dtype, np.integer):
        raise TypeError(f"rows must hold integers, got dtype {rows.dtype}")
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be > 0, got {row_bytes}")
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size:
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0:
            raise ValueError(f"row {lo} is negative")
        if (hi + 1) * row_bytes > f.size:
            raise ValueError(f"row {hi} ends at byte {(hi + 1) * row_bytes}, past the end of "
                             f"{f.path} ({f.size} bytes)")
    return rows


def _check_out(out: np.ndarray | None, n: int, row_bytes: int) -> np.ndarray:
    if out is None:
        return np.empty((n, row_bytes), dtype=np.uint8)
    if (out.shape != (n, row_bytes) or out.dtype != np.uint8 or not out.flags.c_contiguous
            or not out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous uint8 array of shape "
                         f"{(n, row_bytes)}, got {out.dtype} {out.shape}")
    return out


def iter_rows(engine: Engine, f: EngineFile, rows: np.ndarray, row_bytes: int,
              offsets: np.ndarray, lengths: np.ndarray,
              staging: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
    """Read the sorted extents covering sorted `rows` chunk by chunk into the two halves
    of `staging` (from Engine.alloc), the next chunk's reads in flight while the caller
    uses the current one.

    Yields (lo, hi, pos) per chunk: rows[lo:hi] now sit at staging[pos[k]:+row_bytes]."""
    unit = max(f.block_size, f.mem_align, 1)
    half = len(staging) // 2 // unit * unit
    if len(lengths) and lengths.max() > half:
        raise ValueError(f"extent of {lengths.max()} bytes exceeds half the staging area ({half})")
    # a last page may run past EOF: read up to the end of the file's last block only
    limit = -(-f.size // f.block_size) * f.block_size
    lengths = np.minimum(offsets + lengths, limit) - offsets
    ends = np.cumsum(lengths)
    chunks, a = [], 0
    while a < len(offsets):  # extents a..b-1 fill at most half the staging area
        b = int(np.searchsorted(ends, ends[a] - lengths[a] + half, "right"))
        chunks.append((a, b))
        a = b
    starts = rows * row_bytes

    def submit(k: int) -> tuple[Handle, np.ndarray]:
        a, b = chunks[k]
        dest = (k % 2) * half + ends[a:b] - lengths[a:b] - (ends[a] - lengths[a])
        return engine.submit(f, offsets[a:b], lengths[a:b], staging, dest), dest

    if len(rows) and not chunks:
        raise ValueError(f"no extents given to read {len(rows)} rows of {f.path}")
    pending = submit(0) if chunks else None
    try:
        for k, (a, b) in enumerate(chunks):
            handle, dest = pending
            pending = submit(k + 1) if k + 1 < len(chunks) else None
            handle.wait()
            # A chunk's rows start before the next chunk's first extent: a row starting on
            # a page two extents share belongs to the later one.
            lo = int(np.searchsorted(starts, offsets[a])) if k else 0
            hi = int(np.searchsorted(starts, offsets[b])) if b < len(offsets) else len(starts)
            e = np.searchsorted(offsets[a:b], starts[lo:hi], "right") - 1
            if len(e) and e[0] < 0:  # (e is sorted) a row before the chunk's first extent
                raise _uncovered(f, rows[lo])
            into = starts[lo:hi] - offsets[a:b][e]  # each row's place in its extent
            bad = into + row_bytes > lengths[a:b][e]
            if bad.any():
                raise _uncovered(f, rows[lo + int(np.argmax(bad))])
            yield lo, hi, dest[e] + into
    finally:
        if pending is not None:  # stopped early or failed: stop what is still queued
            pending[0].cancel()


def _uncovered(f: EngineFile, row: int) -> ValueError:
    return ValueError(f"row {row} of {f.path} lies outside the extents given to read it")


def read_rows(engine: Engine, f: EngineFile, rows: Any, row_bytes: int, offsets: Any,
              lengths: Any, out: np.ndarray | None, staging: np.ndarray | None) -> np.ndarray:
    """out[i] = bytes of row rows[i] (any order, repeats allowed), read by the given
    extents, which must cover every row."""
    rows = _check_rows(f, rows, row_bytes)
    out = _check_out(out, len(rows), row_bytes)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if len(rows) == 0:
        return out
    order = None if np.all(rows[1:] >= rows[:-1]) else np.argsort(rows, kind="stable")
    ordered = rows if order is None else rows[order]
    if staging is None:
        staging = engine.alloc(max(2 * engine.chunk_bytes, 2 * int(lengths.max(initial=0))))
    for lo, hi, pos in iter_rows(engine, f, ordered, row_bytes, offsets, lengths, staging):
        copy_rows(staging, pos, row_bytes, out if order is not None else out[lo:hi],
                  None if order is None else order[lo:hi])
    return out
