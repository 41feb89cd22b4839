"""The one place the planner touches the disk: a thin adapter over gnnssd.io_engine.

Reads are O_DIRECT (no page-cache help) into page-aligned buffers. The engine picks
io_uring or, where that cannot be set up, its C thread pool doing pread.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from gnnssd.io_engine import ChecksumError, Engine, Handle
from gnnssd.io_engine import ALIGNMENT
from gnnssd.storage_format import PageChecksumError


@contextmanager
def store_errors() -> Iterator[None]:
    """The engine's ChecksumError as the store's PageChecksumError (same errno, message and
    file), so that a caller catching StoreError sees a corrupt page however it was read."""
    try:
        yield
    except ChecksumError as exc:
        raise PageChecksumError(exc.errno, exc.strerror, exc.filename) from exc


class DirectIO:
    """Batch reads of (offset, length) extents into an aligned buffer.

    `checksums` maps a file (e.g. Store.features_path) to its page checksums
    (Store.page_checksums()): every open of that file verifies each page read.
    """

    def __init__(self, queue_depth: int = 64, backend: str = "auto",
                 checksums: Mapping[str | Path, np.ndarray] | None = None):
        self.queue_depth = queue_depth
        self._engine = Engine(backend=backend, queue_depth=queue_depth)
        self._checksums = {os.path.realpath(p): c for p, c in (checksums or {}).items()}

    @property
    def backend(self) -> str:
        return self._engine.backend

    def open(self, path: str | Path):
        return self._engine.open(str(path), checksums=self._checksums.get(os.path.realpath(path)))

    def close(self, f) -> None:
        f.close()

    def alloc(self, nbytes: int, pinned: bool = False) -> np.ndarray:
        """Aligned uint8 buffer of at least nbytes (rounded up to the engine's alignment);
        `pinned`: page-locked (torch's pinned allocator; needs CUDA), so that a GPU copies
        out of it asynchronously."""
        nbytes = max(-(-nbytes // ALIGNMENT) * ALIGNMENT, ALIGNMENT)
        if not pinned:
            return self._engine.alloc(nbytes)
        from gnnssd.pipeline.hot_cache import pinned_empty  # imports torch

        raw = pinned_empty(nbytes + ALIGNMENT)
        start = -raw.ctypes.data % ALIGNMENT
        return raw[start:start + nbytes]

    def submit(self, f, offsets: np.ndarray, lengths: np.ndarray, buf: np.ndarray, dest: np.ndarray) -> Handle:
        """Start read_extents' reads and return at once (`wait` ends them): `buf` must stay
        untouched until then."""
        offsets, lengths, dest = (np.ascontiguousarray(a, dtype=np.int64) for a in (offsets, lengths, dest))
        return self._engine.submit(f, offsets, lengths, buf, dest)

    @staticmethod
    def wait(handle: Handle) -> None:
        """Block until `submit`'s reads are done; a corrupt page raises PageChecksumError."""
        with store_errors():
            handle.wait()

    def read_extents(self, f, offsets: np.ndarray, lengths: np.ndarray, buf: np.ndarray, dest: np.ndarray) -> None:
        """Read file[offsets[i]:+lengths[i]] into buf[dest[i]:+lengths[i]]; all page-aligned."""
        self.wait(self.submit(f, offsets, lengths, buf, dest))

    def read_rows(self, f, rows: np.ndarray, row_bytes: int, offsets: np.ndarray, lengths: np.ndarray,
                  out: np.ndarray, staging: np.ndarray) -> np.ndarray:
        """out[k] = row rows[k] of f, read by the extents covering them (the engine's reader)."""
        with store_errors():
            return self._engine.read_rows(f, rows, row_bytes, offsets, lengths, out, staging)

    def iter_rows(self, f, rows: np.ndarray, row_bytes: int, offsets: np.ndarray, lengths: np.ndarray,
                  staging: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """Engine.iter_rows: sorted rows chunk by chunk through `staging`."""
        with store_errors():
            yield from self._engine.iter_rows(f, rows, row_bytes, offsets, lengths, staging)

    def shutdown(self) -> None:
        self._engine.close()
