"""The row readers: rows of a fixed-stride file, of any size and alignment, read as
page-aligned extents into scratch memory and copied out in C.

C plans the extents (one per row, or merged in file order when max_gap >= 0) and copies
the rows; the extents are read in chunks of at most Engine.chunk_bytes, CHUNKS_IN_FLIGHT at a time,
so that the queue stays full while a finished chunk is copied out.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._gnnssd_io import ffi, lib

if TYPE_CHECKING:
    from .engine import Engine, EngineFile, Handle

CHUNKS_IN_FLIGHT = 4


def _ptr(arr: np.ndarray | None, ctype: str = "int64_t[]") -> Any:
    return ffi.NULL if arr is None else ffi.from_buffer(ctype, arr)


def _check_rows(f: EngineFile, rows: Any, row_bytes: int, base_offset: int) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 1:
        raise ValueError(f"rows must be a 1-D array, got shape {rows.shape}")
    if rows.size and not np.issubdtype(rows.dtype, np.integer):
        raise TypeError(f"rows must hold integers, got dtype {rows.dtype}")
    if row_bytes <= 0 or base_offset < 0:
        raise ValueError(f"row_bytes must be > 0 and base_offset >= 0, got {row_bytes} "
                         f"and {base_offset}")
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size:
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0:
            raise ValueError(f"row {lo} is negative")
        if base_offset + (hi + 1) * row_bytes > f.size:
            raise ValueError(f"row {hi} ends at byte {base_offset + (hi + 1) * row_bytes}, "
                             f"past the end of {f.path} ({f.size} bytes)")
    return rows


def _check_out(out: np.ndarray | None, n: int, row_bytes: int) -> np.ndarray:
    if out is None:
        return np.empty((n, row_bytes), dtype=np.uint8)
    if (out.shape != (n, row_bytes) or out.dtype != np.uint8 or not out.flags.c_contiguous
            or not out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous uint8 array of shape "
                         f"{(n, row_bytes)}, got {out.dtype} {out.shape}")
    return out


def read_rows(engine: Engine, f: EngineFile, rows: Any, row_bytes: int, base_offset: int,
              out: np.ndarray | None, max_gap: int) -> np.ndarray:
    """out[i] = bytes of row rows[i]; max_gap < 0 reads each row's pages on their own."""
    rows = _check_rows(f, rows, row_bytes, base_offset)
    n = len(rows)
    out = _check_out(out, n, row_bytes)
    if n == 0:
        return out
    order = np.argsort(rows, kind="stable") if max_gap >= 0 else None
    page = max(engine.page_size, f.block_size)
    ext_off, ext_len, ext_dst, row_src, row_ext = (np.empty(n, np.int64) for _ in range(5))
    n_ext = lib.gio_rows_plan(_ptr(rows), _ptr(order), n, row_bytes, base_offset, page,
                              max_gap, max(engine.max_extent_bytes, page), _ptr(ext_off),
                              _ptr(ext_len), _ptr(ext_dst), _ptr(row_src), _ptr(row_ext))
    ext_off, ext_dst = ext_off[:n_ext], ext_dst[:n_ext]
    # a page may run past EOF: read up to the end of the file's last block only
    limit = -(-f.size // f.block_size) * f.block_size
    ext_len = np.minimum(ext_off + ext_len[:n_ext], limit) - ext_off
    chunks = _chunks(ext_dst, ext_len, engine.chunk_bytes)
    cap = max(int(ext_dst[b - 1] + ext_len[b - 1] - ext_dst[a]) for a, b in chunks)
    scratch = [engine.alloc(cap) for _ in range(min(CHUNKS_IN_FLIGHT, len(chunks)))]

    pending: list[tuple[Handle, int, int, np.ndarray]] = []
    try:
        for k, (a, b) in enumerate(chunks):
            buf = scratch[k % len(scratch)]
            h = engine.submit(f, ext_off[a:b], ext_len[a:b], buf, ext_dst[a:b] - ext_dst[a])
            pending.append((h, a, b, buf))
            if len(pending) == len(scratch):
                _copy_out(*pending.pop(0), ext_dst, row_src, row_ext, order, row_bytes, out)
        while pending:
            _copy_out(*pending.pop(0), ext_dst, row_src, row_ext, order, row_bytes, out)
    finally:
        for h, *_ in pending:  # only after an error: stop what is still queued
            h.cancel()
    return out


def _chunks(ext_dst: np.ndarray, ext_len: np.ndarray, chunk_bytes: int) -> list[tuple[int, int]]:
    """Consecutive extent ranges [a, b) whose scratch span is at most chunk_bytes (or one
    extent, if a single extent is larger)."""
    ends = ext_dst + ext_len
    bounds, a = [], 0
    while a < len(ext_dst):
        b = max(a + 1, int(np.searchsorted(ends, ext_dst[a] + chunk_bytes, side="right")))
        bounds.append((a, b))
        a = b
    return bounds


def _copy_out(h: Handle, a: int, b: int, buf: np.ndarray, ext_dst: np.ndarray,
              row_src: np.ndarray, row_ext: np.ndarray, order: np.ndarray | None,
              row_bytes: int, out: np.ndarray) -> None:
    h.wait()
    r0, r1 = np.searchsorted(row_ext, [a, b])
    # visited rows r0..r1 go to out[order[r]], or in place (out[r]) without an order
    dest = out if order is not None else out[r0:r1]
    lib.gio_rows_copy(_ptr(buf, "uint8_t[]"), int(ext_dst[a]), _ptr(row_src[r0:r1]),
                      _ptr(None if order is None else order[r0:r1]), int(r1 - r0), row_bytes,
                      _ptr(dest, "uint8_t[]"))
