"""Rows of a fixed-stride file (row r at r * row_bytes) and the page-aligned extents that
read them: which chunk of extents goes where in a staging area, where each row then sits
in it, and the C copy that moves rows out. No I/O here: Engine.read_rows and iter_rows
(engine.py) submit the chunks this module lays out.

Which extents cover the rows (one per row, or merged runs) is the read planner's choice
(gnnssd.sampler.readplan): the reader takes them as given. The extents are read in chunks
of at most half the staging area, the next chunk's reads in flight while the current
chunk's rows are copied out.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from ._gnnssd_io import ffi, lib


class RowFile(Protocol):
    """What the row layout needs of an open file (an EngineFile)."""

    path: str
    size: int
    block_size: int
    mem_align: int


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


def gather_rows(sources: Sequence[np.ndarray], level: np.ndarray, slot: np.ndarray, at: np.ndarray,
                out: np.ndarray, threads: int = 1) -> None:
    """out[at[k]] = sources[level[k]][slot[k]] for every k (out[k] when `at` is empty; other
    rows of out left as they are): sources and out are C-contiguous arrays of rows of the
    same byte size (first axis: rows). In C on `threads` threads, the GIL released, with
    the next rows' loads started ahead and, for a large x, streaming stores: the gather of
    a mini-batch's x, its rows scattered over hundreds of MiB. Every index is checked
    before any row is copied."""
    row_bytes = out.nbytes // len(out) if len(out) else 0
    for name, a in [*((f"source {i}", s) for i, s in enumerate(sources)), ("out", out)]:
        if not a.flags.c_contiguous or a.ndim == 0 or (len(a) and a.nbytes // len(a) != row_bytes):
            raise ValueError(f"{name} must be C-contiguous rows of {row_bytes} bytes, got {a.dtype} {a.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writable")
    level = np.ascontiguousarray(level, dtype=np.int8)
    slot = np.ascontiguousarray(slot, dtype=np.int64)
    at = np.ascontiguousarray(at, dtype=np.int64)
    if len(level) != len(slot) or (len(at) and len(at) != len(slot)):
        raise ValueError(f"level, slot and at differ in length: {len(level)}, {len(slot)}, {len(at)}")
    if not len(slot):
        return
    # a source of no rows has no buffer to point at: any address, never read (its rows are 0)
    buffers = [ffi.from_buffer("uint8_t[]", s) if s.nbytes else ffi.NULL for s in sources]
    pointers = ffi.new("uint8_t *[]", buffers)
    rows = np.array([len(s) for s in sources], np.int64)
    bad = lib.gio_rows_gather(pointers, _ptr(rows), len(sources), _ptr(level, "int8_t[]"), _ptr(slot),
                              _ptr(at) if len(at) else ffi.NULL, len(slot), row_bytes,
                              ffi.from_buffer("uint8_t[]", out, require_writable=True), len(out), threads)
    if bad >= 0:
        to = int(at[bad]) if len(at) else int(bad)
        raise ValueError(f"row {bad} of the gather is out of range: level {level[bad]} of {len(sources)}, slot "
                         f"{slot[bad]} of {rows[level[bad]] if 0 <= level[bad] < len(rows) else '-'} rows, "
                         f"to row {to} of {len(out)}")


def check_rows(f: RowFile, rows: Any, row_bytes: int) -> np.ndarray:
    """`rows` as a contiguous int64 array, refused unless 1-D integers inside the file."""
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


def check_out(out: np.ndarray | None, n: int, row_bytes: int) -> np.ndarray:
    """`out`, or a new (n, row_bytes) uint8 array, refused unless it fits."""
    if out is None:
        return np.empty((n, row_bytes), dtype=np.uint8)
    if (out.shape != (n, row_bytes) or out.dtype != np.uint8 or not out.flags.c_contiguous
            or not out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous uint8 array of shape "
                         f"{(n, row_bytes)}, got {out.dtype} {out.shape}")
    return out


class RowChunks:
    """The sorted extents covering sorted int64 `rows` of `f`, cut into chunks of at most half
    a staging area of `staging_bytes` (chunks alternate halves: the next chunk is read while
    the current one's rows are copied out): where each chunk's extents go in the staging
    area, and where its rows then sit."""

    def __init__(self, f: RowFile, rows: np.ndarray, row_bytes: int, offsets: np.ndarray,
                 lengths: np.ndarray, staging_bytes: int):
        unit = max(f.block_size, f.mem_align, 1)
        self.half = half = staging_bytes // 2 // unit * unit
        if len(lengths) and lengths.max() > half:
            raise ValueError(f"extent of {lengths.max()} bytes exceeds half the staging area ({half})")
        # a last page may run past EOF: read up to the end of the file's last block only
        limit = -(-f.size // f.block_size) * f.block_size
        self.offsets, self.lengths = offsets, np.minimum(offsets + lengths, limit) - offsets
        self.ends = ends = np.cumsum(self.lengths)
        self.bounds: list[tuple[int, int]] = []
        a = 0
        while a < len(offsets):  # extents a..b-1 fill at most half the staging area
            b = int(np.searchsorted(ends, ends[a] - self.lengths[a] + half, "right"))
            self.bounds.append((a, b))
            a = b
        if len(rows) and not self.bounds:
            raise ValueError(f"no extents given to read {len(rows)} rows of {f.path}")
        self.f, self.rows, self.row_bytes = f, rows, row_bytes
        self.starts = rows * row_bytes

    def __len__(self) -> int:
        return len(self.bounds)

    def extents(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chunk k's (offsets, lengths, places in the staging area)."""
        a, b = self.bounds[k]
        ends, lengths = self.ends[a:b], self.lengths[a:b]
        return self.offsets[a:b], lengths, (k % 2) * self.half + ends - lengths - (ends[0] - lengths[0])

    def positions(self, k: int, dest: np.ndarray) -> tuple[int, int, np.ndarray]:
        """Once chunk k is read to `dest` (its places): (lo, hi, pos), rows[lo:hi] at
        staging[pos[i]:+row_bytes]."""
        a, b = self.bounds[k]
        offsets, lengths, starts = self.offsets, self.lengths, self.starts
        # A chunk's rows start before the next chunk's first extent: a row starting on
        # a page two extents share belongs to the later one.
        lo = int(np.searchsorted(starts, offsets[a])) if k else 0
        hi = int(np.searchsorted(starts, offsets[b])) if b < len(offsets) else len(starts)
        e = np.searchsorted(offsets[a:b], starts[lo:hi], "right") - 1
        if len(e) and e[0] < 0:  # (e is sorted) a row before the chunk's first extent
            raise self._uncovered(self.rows[lo])
        into = starts[lo:hi] - offsets[a:b][e]  # each row's place in its extent
        bad = into + self.row_bytes > lengths[a:b][e]
        if bad.any():
            raise self._uncovered(self.rows[lo + int(np.argmax(bad))])
        return lo, hi, dest[e] + into

    def _uncovered(self, row: int) -> ValueError:
        return ValueError(f"row {row} of {self.f.path} lies outside the extents given to read it")
