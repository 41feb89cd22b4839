"""Compact-block files written with O_DIRECT by background threads, as the repack scan runs.

The scan thread copies rows straight into page-aligned chunk buffers; full chunks go to
writer threads (os.pwrite releases the GIL), so copying the next rows overlaps the disk
writes. O_DIRECT keeps the blocks out of the page cache (the loader reads them back with
O_DIRECT anyway) and leaves nothing to flush at the end but metadata. Where the
filesystem refuses O_DIRECT, files are written through the page cache, synced and dropped.
"""
from __future__ import annotations

import errno
import os
import queue
import threading
from pathlib import Path

import numpy as np

from gnnssd.io_engine import copy_rows
from gnnssd.storage_format import PAGE

MAX_CHUNK = 1 << 20  # one write request
SPARE_CHUNKS = 4  # chunks queued for the writers beyond one per open block
WRITERS = 3  # threads: single 1 MiB O_DIRECT writes are latency-bound


class BlockWriter:
    """Appends rows to several block files at once. Use as a context manager: leaving it
    normally pads each file to a page and waits for the writes; on error it stops."""

    def __init__(self, paths: list[Path], row_bytes: int, alloc, memory_bytes: int = 16 << 20,
                 max_chunk: int = MAX_CHUNK, open_at_once: int | None = None):
        """Chunks share `memory_bytes` (one per block being written, SPARE_CHUNKS more), each
        at most `max_chunk` and at least two rows (a row spans at most two chunks). A block
        holds a chunk from its first append until the chunk is full or the block is closed
        (`close`), so with `open_at_once` (the most blocks ever appended to and not yet
        closed; default all) the chunks are larger: fewer copies and writes."""
        self.row_bytes = row_bytes
        at_once = len(paths) if open_at_once is None else max(1, min(open_at_once, len(paths)))
        chunk = min(max_chunk, memory_bytes // (at_once + SPARE_CHUNKS))
        self.chunk = max(chunk // PAGE, -(-2 * row_bytes // PAGE), 1) * PAGE
        self.direct = True
        self.paths = {}  # fd -> its file, for the errors
        self.fds: list[int] = []
        try:
            for path in paths:
                self.fds.append(self._open(path))
                self.paths[self.fds[-1]] = path
        except OSError:
            for fd in self.fds:
                os.close(fd)
            raise
        self.offsets = [0] * len(paths)
        self.fill = [0] * len(paths)
        self._free: queue.Queue = queue.Queue()
        for _ in range(at_once + SPARE_CHUNKS):
            self._free.put(alloc(self.chunk))
        self.bufs: list[np.ndarray | None] = [None] * len(paths)  # a chunk once appended to
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

    def append(self, block: int, src: np.ndarray, pos: np.ndarray) -> None:
        """Append the rows at staging positions `pos` of `src` to block number `block`."""
        rb = self.row_bytes
        while len(pos):
            if self.bufs[block] is None:
                self.bufs[block] = self._free.get()
            buf, fill = self.bufs[block], self.fill[block]
            whole = min((self.chunk - fill) // rb, len(pos))
            copy_rows(src, pos[:whole], rb, buf[fill : fill + whole * rb].reshape(whole, rb))
            fill += whole * rb
            pos = pos[whole:]
            if len(pos) and fill < self.chunk:  # a row straddles the chunk's end
                row = np.empty((1, rb), np.uint8)
                copy_rows(src, pos[:1], rb, row)
                head = self.chunk - fill
                buf[fill:] = row[0, :head]
                self._submit(block, self.chunk)
                self.bufs[block] = self._free.get()
                self.bufs[block][: rb - head] = row[0, head:]
                self.fill[block] = rb - head
                pos = pos[1:]
            elif fill == self.chunk:
                self._submit(block, self.chunk)
            else:
                self.fill[block] = fill

    def _submit(self, block: int, nbytes: int) -> None:
        if self._error is not None:
            raise self._error
        self._todo.put((self.fds[block], self.offsets[block], self.bufs[block], nbytes))
        self.offsets[block] += nbytes
        self.bytes_written += nbytes
        self.bufs[block] = None
        self.fill[block] = 0

    def _write_loop(self) -> None:
        while True:
            item = self._todo.get()
            if item is None:
                return
            fd, offset, buf, nbytes = item
            try:
                if self._error is None:
                    view = memoryview(buf)[:nbytes]
                    while len(view):
                        done = os.pwrite(fd, view, offset)
                        view, offset = view[done:], offset + done
            except OSError as e:  # a full scratch disk, most likely: name the file and the way out
                self._error = OSError(e.errno, f"{self.paths[fd]}: cannot write ({e.strerror}); free "
                                      "space on its disk, or set ssd.block_budget: 0 (no compact "
                                      "blocks: rows are read in place)")
            except BaseException as e:
                self._error = e
            self._free.put(buf)

    def close(self, block: int) -> None:
        """No more rows for `block`: its last chunk, padded with zeros to a page, goes to
        the writers, and the chunk to the next block."""
        fill = self.fill[block]
        if fill:
            padded = -(-fill // PAGE) * PAGE
            self.bufs[block][fill:padded] = 0
            self._submit(block, padded)
        elif self.bufs[block] is not None:
            self._free.put(self.bufs[block])
            self.bufs[block] = None

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
