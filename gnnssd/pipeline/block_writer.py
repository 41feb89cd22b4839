"""Compact-block files written with O_DIRECT by background threads, as the repack scan runs.

The scan thread copies rows straight into page-aligned chunk buffers; full chunks go to
writer threads (os.pwrite releases the GIL), so copying the next rows overlaps the disk
writes. O_DIRECT keeps the blocks out of the page cache (the loader reads them back with
O_DIRECT anyway) and leaves nothing to flush at the end but metadata. Where the
filesystem refuses O_DIRECT, files are written through the page cache, synced and dropped.

The copies run in one numba kernel per call (`_fill`): for the repack scan that is one call
per scan chunk for all its blocks, not Python and NumPy per (scan chunk, block) pair.
"""
from __future__ import annotations

import errno
import os
import queue
import threading
from pathlib import Path

import numba as nb
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from gnnssd.storage_format import PAGE, disk_of

MAX_CHUNK = 1 << 20  # one write request
SPARE_CHUNKS = 4  # chunks queued for the writers beyond one per open block
WRITERS = 3  # threads: single 1 MiB O_DIRECT writes are latency-bound


def row_lists(lists: list[np.ndarray], within: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lists of rows as one int64 array and where each lies in it (list j is
    rows[starts[j]:ends[j]]): what `_fill` takes (a numba typed List took ~0.8 CPU-s of
    compiling in every process that built its first one: each packer's first window).
    Lists that are all views of `within` (1-D int64: a packer window's mapped row lists,
    gnnssd.pipeline.packers) are taken where they lie, with no copy; others are concatenated."""
    counts = np.array([len(rows) for rows in lists], np.int64)
    if within is not None and lists:
        starts = np.array([_offset_in(rows, within) for rows in lists], np.int64)
        if (starts >= 0).all():
            return within, starts, starts + counts
    ends = np.cumsum(counts)
    return (np.concatenate(lists).astype(np.int64, copy=False) if lists else NO_KEYS), ends - counts, ends


def _offset_in(rows: np.ndarray, within: np.ndarray) -> int:
    """Where the int64 view `rows` starts in `within` (an empty list: 0), or -1 if it is not
    a contiguous run of it."""
    if not len(rows):
        return 0
    at, rest = divmod(rows.ctypes.data - within.ctypes.data, 8)
    inside = rows.dtype == np.int64 and rows.strides == (8,) and 0 <= at and at + len(rows) <= len(within)
    return at if inside and not rest else -1


#: What `_fill` stopped for: every list copied as far as `top`; list i's block needs a
#: chunk; its chunk is full; list i's last row was just copied; a row of list i is not
#: among the keys.
DONE, NEED_CHUNK, FULL, LIST_END, NOT_FOUND = 0, 1, 2, 3, 4
NO_KEYS = np.empty(0, np.int64)


@intrinsic
def _move(typingctx, dst, to, src, at, n):
    """dst[to:to + n] = src[at:at + n] for uint8 arrays, as one memcpy (LLVM's intrinsic;
    a loop of loads and stores is several times slower on rows not in cache). Unchecked:
    the callers keep the ranges inside both arrays."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        dst_arr = context.make_array(signature.args[0])(context, builder, args[0])
        src_arr = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memcpy(builder, builder.gep(dst_arr.data, [args[1]]), builder.gep(src_arr.data, [args[3]]),
                           args[4], 1)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True)
def _fill(src, keys, pos, rows, starts, ends, cursor, ids, i, top, pool, chunk, buf, fill, carry, row_bytes):
    """Copy rows into the blocks' chunks, list by list from list i: list j is
    rows[starts[j] + cursor[j]:ends[j]] for block ids[j], copied while its rows are
    <= top. A row's bytes are src[pos[searchsorted(keys, row)]:+row_bytes], or
    src[row:+row_bytes] when keys is empty. Block k appends to pool[buf[k] * chunk + fill[k]:] (its chunk);
    carry[k] bytes of its next row are in a previous chunk already (a row straddling two
    chunks). Returns (list, what it stopped for) at the first thing only the caller can do."""
    while i < cursor.shape[0]:
        k, c, r = ids[i], cursor[i], rows[starts[i] : ends[i]]
        b, f, done = buf[k], fill[k], carry[k]
        why = DONE
        j = 0  # the list's rows and the keys are both sorted: one merge walk per list
        if keys.shape[0] and c < r.shape[0]:
            j = np.searchsorted(keys, r[c])
        while c < r.shape[0] and r[c] <= top:
            if b < 0 or f == chunk:  # (full: its last append ended a list at the chunk's end)
                why = NEED_CHUNK if b < 0 else FULL
                break
            at = r[c]
            if keys.shape[0]:
                while j < keys.shape[0] and keys[j] < at:
                    j += 1
                if j == keys.shape[0] or keys[j] != at:
                    why = NOT_FOUND
                    break
                at = pos[j]
            n = min(row_bytes - done, chunk - f)
            _move(pool, b * chunk + f, src, at + done, n)
            f += n
            done = 0 if done + n == row_bytes else done + n
            if done == 0:
                c += 1
                if c == r.shape[0]:
                    why = LIST_END
                    break
            if f == chunk:
                why = FULL
                break
        cursor[i], fill[k], carry[k] = c, f, done
        if why != DONE:
            return i, why
        i += 1
    return i, DONE


class BlockWriter:
    """Appends rows to several block files at once. Use as a context manager: leaving it
    normally pads each file to a page and waits for the writes; on error it stops."""

    def __init__(self, paths: list[Path], row_bytes: int, alloc, memory_bytes: int = 16 << 20,
                 max_chunk: int = MAX_CHUNK, open_at_once: int | None = None, rows: list[int] | None = None):
        """Chunks share `memory_bytes` (one per block being written, SPARE_CHUNKS more), each
        at most `max_chunk` and at least two rows (a row spans at most two chunks). A block
        holds a chunk from its first append until the chunk is full or the block is closed
        (`close`), so with `open_at_once` (the most blocks ever appended to and not yet
        closed; default all) the chunks are larger: fewer copies and writes.

        With `rows` (each block's row count), each file is allocated at its final size when
        opened: the writers then overwrite allocated space, which ext4 lets several writes
        to one file do at once (an O_DIRECT write that extends a file holds the file's lock
        until the disk has it, so the writers queued on it), and a full disk is met before
        any row is copied."""
        self.row_bytes = row_bytes
        at_once = len(paths) if open_at_once is None else max(1, min(open_at_once, len(paths)))
        chunk = min(max_chunk, memory_bytes // (at_once + SPARE_CHUNKS))
        self.chunk = max(chunk // PAGE, -(-2 * row_bytes // PAGE), 1) * PAGE
        self.direct = True
        self.paths = {}  # fd -> its file, for the errors
        self.fds: list[int] = []
        try:
            for k, path in enumerate(paths):
                self.fds.append(self._open(path))
                self.paths[self.fds[-1]] = path
                if rows is not None:
                    self._allocate(self.fds[-1], -(-rows[k] * row_bytes // PAGE) * PAGE)
        except OSError:
            for fd in self.fds:
                os.close(fd)
            raise
        self.offsets = [0] * len(paths)
        # chunks: pieces of one page-aligned pool, handed out by number
        count = at_once + SPARE_CHUNKS
        self.pool = alloc(count * self.chunk)[: count * self.chunk]
        self._free: queue.Queue = queue.Queue()
        for b in range(count):
            self._free.put(b)
        self.buf = np.full(len(paths), -1, np.int64)  # block k's chunk (-1: none yet)
        self.fill = np.zeros(len(paths), np.int64)  # bytes in it
        self.carry = np.zeros(len(paths), np.int64)  # bytes of its next row in the previous chunk
        self._todo: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._write_loop, daemon=True, name="gnnssd-block-writer")
                         for _ in range(WRITERS)]
        for t in self._threads:
            t.start()
        self.bytes_written = 0

    def _open(self, path: Path) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if self.direct:
            try:
                return os.open(path, flags | os.O_DIRECT, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.direct = False
        return os.open(path, flags, 0o644)

    def _allocate(self, fd: int, size: int) -> None:
        """Disk space for `size` bytes of the file `fd` (where the filesystem allocates
        ahead: elsewhere the file grows as it is written)."""
        if not size:
            return
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no allocation ahead here
                return
            raise self._write_error(fd, e) from None

    def _write_error(self, fd: int, e: OSError) -> OSError:
        """A failed write or allocation (a full scratch disk, most likely), naming the file
        and the way out."""
        path = Path(self.paths[fd])
        return OSError(e.errno, f"{path}: cannot write ({e.strerror}) {disk_of(path.parent)}; free space on that "
                       "disk, or set ssd.block_budget: 0 (no compact blocks: rows are read in place)")

    def append(self, block: int, src: np.ndarray, pos: np.ndarray) -> None:
        """Append the rows at byte positions `pos` of `src` (1-D uint8) to block number `block`."""
        pos = np.ascontiguousarray(pos, dtype=np.int64)
        if len(pos) and (pos.min() < 0 or pos.max() + self.row_bytes > len(src)):
            raise ValueError(f"a row position lies outside the {len(src)}-byte source")
        starts, cursor = np.zeros(1, np.int64), np.zeros(1, np.int64)  # one list: pos itself
        self._copy(src, NO_KEYS, NO_KEYS, pos, starts, np.array([len(pos)], np.int64), cursor,
                   np.array([block], np.int64), np.iinfo(np.int64).max, close_ends=False)

    def append_sorted(self, src: np.ndarray, keys: np.ndarray, pos: np.ndarray, rows: np.ndarray,
                      starts: np.ndarray, ends: np.ndarray, cursor: np.ndarray, top: int) -> None:
        """For every block k, append its rows (row_lists: rows[starts[k]:ends[k]], sorted
        int64) from cursor[k] up to `top`, row r at src[pos[searchsorted(keys, r)]:] (keys
        sorted int64, holding every such row), advancing cursor[k]; a block whose last row is
        appended is closed. A kernel call per block that needs a chunk or is closed; none per
        (call, block)."""
        self._copy(src, keys, pos, rows, starts, ends, cursor, np.arange(len(cursor), dtype=np.int64), top,
                   close_ends=True)

    def _copy(self, src: np.ndarray, keys: np.ndarray, pos: np.ndarray, rows: np.ndarray, starts: np.ndarray,
              ends: np.ndarray, cursor: np.ndarray, ids: np.ndarray, top: int, close_ends: bool) -> None:
        """Run _fill, doing what it stops for: chunks taken and handed to the writers,
        blocks closed (with `close_ends`)."""
        i = 0
        while True:
            i, why = _fill(src, keys, pos, rows, starts, ends, cursor, ids, i, top, self.pool, self.chunk, self.buf,
                           self.fill, self.carry, self.row_bytes)
            if why == DONE:
                return
            k = int(ids[i])
            if why == NEED_CHUNK:
                self.buf[k] = self._free.get()
            elif why == FULL:  # (its next row is still to come: a list's end stops before)
                self._submit(k, self.chunk)
                self.buf[k] = self._free.get()
            elif why == LIST_END:
                if close_ends:
                    self.close(k)
                i += 1
            else:
                raise ValueError(f"row {rows[starts[i] + cursor[i]]} of block {k} is not among the rows read for it")

    def _submit(self, block: int, nbytes: int) -> None:
        if self._error is not None:
            raise self._error
        self._todo.put((self.fds[block], self.offsets[block], int(self.buf[block]), nbytes))
        self.offsets[block] += nbytes
        self.bytes_written += nbytes
        self.buf[block] = -1
        self.fill[block] = 0

    def _write_loop(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            fd, offset, buf, nbytes = item
            try:
                if self._error is None:
                    view = memoryview(self.pool)[buf * self.chunk : buf * self.chunk + nbytes]
                    while len(view):
                        done = os.pwrite(fd, view, offset)
                        view, offset = view[done:], offset + done
            except OSError as e:
                self._error = self._write_error(fd, e)
            except BaseException as e:
                self._error = e
            self._free.put(buf)

    def close(self, block: int) -> None:
        """No more rows for `block`: its last chunk, padded with zeros to a page, goes to
        the writers, and the chunk to the next block."""
        fill = int(self.fill[block])
        if fill:
            padded = -(-fill // PAGE) * PAGE
            start = int(self.buf[block]) * self.chunk
            self.pool[start + fill : start + padded] = 0
            self._submit(block, padded)
        elif self.buf[block] >= 0:
            self._free.put(int(self.buf[block]))
            self.buf[block] = -1

    def _finish(self) -> None:
        """Close every block, then wait."""
        for block in range(len(self.fill)):
            self.close(block)

    def __enter__(self) -> "BlockWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._finish()
        finally:
            for t in self._threads:
                self._todo.put(None)
            for t in self._threads:
                t.join()
            for fd in self.fds:
                if exc_type is None and self._error is None:
                    os.fsync(fd)
                    if not self.direct:  # the loader reads with O_DIRECT: drop the cached pages
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        if self._error is not None and exc_type is None:
            raise self._error
