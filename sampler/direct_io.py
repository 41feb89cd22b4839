"""The one place the planner touches the disk: gnnssd.io_engine when importable, else pread.

Both paths read with O_DIRECT (no page-cache help) into page-aligned buffers. The fallback
spreads the requests over a thread pool (os.preadv releases the GIL) to keep a queue of
`queue_depth` requests at the drive.
"""
from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ALIGN = 4096


class _PreadFile:
    def __init__(self, path: str):
        self.path = str(path)
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        self.size = os.fstat(self.fd).st_size
        self.block_size = ALIGN

    def close(self) -> None:
        os.close(self.fd)


class _Done:
    def wait(self) -> None:
        pass


class DirectIO:
    """Batch reads of (offset, length) extents into an aligned buffer."""

    def __init__(self, queue_depth: int = 64, backend: str = "auto"):
        self.queue_depth = queue_depth
        self._engine = None
        if backend in ("auto", "engine"):
            try:
                from gnnssd.io_engine import Engine

                self._engine = Engine(backend="auto", queue_depth=queue_depth)
            except (ImportError, AttributeError):
                if backend == "engine":
                    raise
        self._pool = None if self._engine else ThreadPoolExecutor(queue_depth)

    @property
    def backend(self) -> str:
        return "io_engine" if self._engine else "pread"

    def open(self, path: str):
        return self._engine.open(str(path)) if self._engine else _PreadFile(path)

    def close(self, f) -> None:
        getattr(f, "close", lambda: None)()

    def alloc(self, nbytes: int) -> np.ndarray:
        """Page-aligned uint8 buffer of at least nbytes (rounded up to a page)."""
        nbytes = max(-(-nbytes // ALIGN) * ALIGN, ALIGN)
        if self._engine:
            return self._engine.alloc(nbytes)
        return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)

    def read_extents(self, f, offsets: np.ndarray, lengths: np.ndarray, buf: np.ndarray, dest: np.ndarray) -> None:
        """Read file[offsets[i]:+lengths[i]] into buf[dest[i]:+lengths[i]]; all page-aligned."""
        offsets, lengths, dest = (np.ascontiguousarray(a, dtype=np.int64) for a in (offsets, lengths, dest))
        if len(offsets) == 0:
            return
        if self._engine:
            self._engine.read_extents(f, offsets, lengths, buf, dest)
            return
        view = memoryview(buf)
        chunks = np.array_split(np.arange(len(offsets)), min(self.queue_depth, len(offsets)))

        def run(idx: np.ndarray) -> None:
            for i in idx:
                off, ln, d = int(offsets[i]), int(lengths[i]), int(dest[i])
                done = 0
                while done < ln:
                    n = os.preadv(f.fd, [view[d + done : d + ln]], off + done)
                    if n <= 0:
                        raise OSError(f"short read of {f.path} at offset {off + done}")
                    done += n

        for fut in [self._pool.submit(run, c) for c in chunks]:
            fut.result()

    def submit(self, f, offsets: np.ndarray, lengths: np.ndarray, buf: np.ndarray, dest: np.ndarray):
        """Start the reads; `.wait()` on the result blocks until they are done. The pread
        fallback reads before returning (no overlap with the caller)."""
        if self._engine:
            return self._engine.submit(f, *(np.ascontiguousarray(a, dtype=np.int64) for a in (offsets, lengths)), buf, np.ascontiguousarray(dest, dtype=np.int64))
        self.read_extents(f, offsets, lengths, buf, dest)
        return _Done()

    def shutdown(self) -> None:
        if self._engine:
            self._engine.close()
        else:
            self._pool.shutdown()
