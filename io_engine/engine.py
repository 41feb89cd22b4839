"""The engine's Python surface: validates whole request arrays with NumPy and hands them
to the C library in one call; C submits, reaps and resubmits with the GIL released.

Thread safety: one Engine may be shared by threads (internal locking: the C request queue
and each batch have their own mutex, the Python bookkeeping has one lock). Only `close`
must not race other calls on the same engine.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from concurrent.futures import CancelledError
from typing import Any, Iterator

import numpy as np

from ._gnnssd_io import ffi, lib
from .crc import PAGE as CHECKSUM_PAGE
from .crc import checksum_error
from .rows import RowChunks, check_out, check_rows, copy_rows

log = logging.getLogger(__name__)

ALIGNMENT = lib.GIO_DIO_ALIGN  # of Engine.alloc buffers; a file's own O_DIRECT needs: EngineFile
_BACKENDS = {
    "auto": lib.GIO_BACKEND_AUTO,
    "io_uring": lib.GIO_BACKEND_URING,
    "threads": lib.GIO_BACKEND_THREADS,
}
_BACKEND_NAMES = {lib.GIO_BACKEND_URING: "io_uring", lib.GIO_BACKEND_THREADS: "threads"}
# A wait sleeps in C at most this long at a time, so that Python sees Ctrl-C in between.
_WAIT_SLICE_S = 0.1
_logged_choices: set[str] = set()
_log_lock = threading.Lock()


def alloc(nbytes: int) -> np.ndarray:
    """A zero-copy uint8 array whose data starts on an ALIGNMENT boundary; NumPy owns the
    memory, so it is freed when the last view dies (torch.from_numpy shares it)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes]


def _log_choice(name: str, uring_err: int) -> None:
    with _log_lock:
        if name in _logged_choices:
            return
        _logged_choices.add(name)
    if uring_err:
        log.warning(
            "io_uring unavailable (%s); using the thread-pool backend",
            os.strerror(uring_err),
        )
    else:
        log.info("using the %s backend", name)


def _int64_array(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


# Buffers of batches whose io_uring ring broke before it could be drained: the kernel may
# still write into them, so they are kept alive for the life of the process.
_abandoned_buffers: list[tuple[Any, ...]] = []


def _page_checksums(path: str, size: int, checksums: Any) -> np.ndarray:
    """The per-page CRC32C array for a file of `size` bytes, checked for length."""
    arr = np.ascontiguousarray(checksums, dtype=np.uint32)
    pages = -(-size // CHECKSUM_PAGE)
    if arr.shape != (pages,):
        raise ValueError(f"{path}: {size} bytes are {pages} pages of {CHECKSUM_PAGE}, but "
                         f"{arr.size} page checksums were given")
    return arr


def _first(mask: np.ndarray) -> int | None:
    return int(np.argmax(mask)) if mask.any() else None


class EngineFile:
    """A read-only handle opened by Engine.open (O_DIRECT unless direct=False)."""

    def __init__(self, engine: Engine, path: str, fd: int, size: int, block_size: int,
                 mem_align: int, direct: bool, checksums: np.ndarray | None = None) -> None:
        self.path = path
        self.checksums = checksums  # CRC32C per 4 KiB page, verified on every read
        self.size = size
        self.block_size = block_size  # offsets and lengths must be multiples of it
        self.mem_align = mem_align    # destination addresses must be multiples of it
        self.direct = direct
        self._engine = engine
        self._fd = fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError(f"file {self.path} is closed")
        return self._fd

    def close(self) -> None:
        """Close the fd; reads of this file still queued are cancelled and drained first,
        so that no read lands in a file that reuses the fd number."""
        if self._fd < 0:
            return
        self._engine._cancel_file(self)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> EngineFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)

    def __repr__(self) -> str:
        return f"EngineFile({self.path!r}, size={self.size}, block_size={self.block_size})"


class Handle:
    """Reads submitted together; `wait` blocks (GIL released) until they are all done."""

    def __init__(self, engine: Engine, file: EngineFile, batch: Any, offsets: np.ndarray,
                 lengths: np.ndarray, keep: tuple[Any, ...]) -> None:
        self._engine = engine
        self._file = file
        self._batch = batch
        self._offsets = offsets
        self._lengths = lengths
        self._keep = keep  # request arrays and the buffer: C reads them until done
        self._finished = False
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._finished or bool(lib.gio_batch_done(self._batch))

    def cancel(self) -> None:
        """Drop the reads not started yet (those in flight finish); wait() then raises
        CancelledError."""
        with self._engine._lock:
            if not self._finished:
                lib.gio_batch_cancel(self._batch)

    def wait(self, timeout: float | None = None) -> None:
        """Block until every read is done; raise OSError for a failed read, TimeoutError
        when timeout seconds pass first (the reads go on). An interrupt (Ctrl-C) cancels
        the reads, waits for those in flight, and propagates."""
        if not self._finished:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while not lib.gio_batch_wait(self._batch, self._slice_ms(deadline)):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"reads of {self._file.path} not done after {timeout} s")
            except TimeoutError:
                raise
            except BaseException:
                self.cancel()
                self._drain()
                raise
            self._finish()
        if self._error is not None:
            raise self._error

    @staticmethod
    def _slice_ms(deadline: float | None) -> int:
        left = _WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
        return max(0, int(min(_WAIT_SLICE_S, left) * 1000))

    def _drain(self) -> None:
        lib.gio_batch_wait(self._batch, -1)  # bounded: only reads in flight remain
        self._finish()

    def _finish(self) -> None:
        """Record the outcome of a done batch (idempotent)."""
        with self._engine._lock:
            if self._finished:
                return
            index, page, got = ffi.new("size_t *"), ffi.new("int64_t *"), ffi.new("uint32_t *")
            err = lib.gio_batch_error(self._batch, index, page, got)
            if lib.gio_batch_abandoned(self._batch):
                log.error("the io_uring ring broke with reads of %s in flight; their buffers "
                          "are kept for the life of the process", self._file.path)
                _abandoned_buffers.append(self._keep)
            if err == errno.EBADMSG and page[0] >= 0:
                bad = int(page[0])
                self._error = checksum_error(self._file.path, bad, int(got[0]),
                                             int(self._file.checksums[bad]))
            elif err:
                i = int(index[0])
                self._error = OSError(
                    err,
                    f"{os.strerror(err)}: read of {self._file.path} at offset "
                    f"{self._offsets[i]}, length {self._lengths[i]} (request {i} of "
                    f"{len(self._offsets)}) failed",
                    self._file.path,
                )
            elif lib.gio_batch_cancelled(self._batch):
                self._error = CancelledError(
                    f"reads of {self._file.path} were cancelled before completion")
            self._keep = ()
            self._finished = True
            self._engine._inflight.discard(self)


class Engine:
    """Batched O_DIRECT reads through io_uring, or through a C thread pool doing pread.

    backend: "auto" (io_uring, else threads), "io_uring" or "threads".
    queue_depth: reads in flight per ring. rings: io_uring rings, each with a driver
    thread. threads: thread-pool size (default: queue_depth). sqpoll/iopoll: io_uring
    SQPOLL (a kernel thread polls the queue; costs a core) and IOPOLL (needs a polled
    NVMe queue). chunk_bytes: half the staging area read_rows allocates when given none.
    Defaults measured on the development machine (virtio disk, 2 cores, random 4 KiB):
    one ring at depth 128 matched two rings at 64; SQPOLL took ~4x the CPU per read and
    lost throughput (its kernel thread competes for the 2 cores).
    """

    def __init__(self, backend: str = "auto", queue_depth: int = 128, *, rings: int = 1,
                 threads: int | None = None, sqpoll: bool = False, iopoll: bool = False,
                 chunk_bytes: int = 8 << 20) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {sorted(_BACKENDS)}, got {backend!r}")
        self.queue_depth = queue_depth
        self.chunk_bytes = chunk_bytes
        self._lock = threading.RLock()
        self._inflight: set[Handle] = set()
        flags = (lib.GIO_FLAG_SQPOLL if sqpoll else 0) | (lib.GIO_FLAG_IOPOLL if iopoll else 0)
        err, uring_err = ffi.new("int *"), ffi.new("int *")
        eng = lib.gio_engine_new(_BACKENDS[backend], queue_depth, rings,
                                 threads if threads is not None else queue_depth, flags,
                                 err, uring_err)
        if eng == ffi.NULL:
            self._eng = None
            if backend == "io_uring":
                raise OSError(err[0], f"cannot set up io_uring: {os.strerror(err[0])}"
                              " (backend='threads' works without it)")
            raise OSError(err[0], f"cannot start the I/O engine (queue_depth={queue_depth},"
                          f" rings={rings}, threads={threads}): {os.strerror(err[0])}")
        self._eng = eng
        self.backend = _BACKEND_NAMES[lib.gio_engine_backend(eng)]
        _log_choice(self.backend, uring_err[0] if backend == "auto" else 0)

    # -- files and buffers --------------------------------------------------------------

    def open(self, path: str | os.PathLike[str], direct: bool = True,
             checksums: Any = None) -> EngineFile:
        """Open path for reading; with direct=True (O_DIRECT) offsets, lengths and
        destination addresses must be aligned (f.block_size, f.mem_align). With
        `checksums` (the CRC32C of every 4 KiB page, e.g. Store.page_checksums()) every
        page read is verified in C and a mismatch raises ChecksumError; reads must then
        cover whole pages."""
        self._check_open()
        path_s = os.fspath(path)
        size, off_al, mem_al, err = (ffi.new("int64_t *"), ffi.new("int *"),
                                     ffi.new("int *"), ffi.new("int *"))
        fd = lib.gio_open(os.fsencode(path_s), int(direct), size, off_al, mem_al, err)
        if fd < 0:
            e = err[0]
            if direct and e == errno.EINVAL:
                raise OSError(e, f"cannot open {path_s} with O_DIRECT: its filesystem "
                              "refuses direct I/O (tmpfs does); use direct=False", path_s)
            raise OSError(e, os.strerror(e), path_s)
        try:
            crcs = None if checksums is None else _page_checksums(path_s, int(size[0]), checksums)
        except ValueError:
            os.close(fd)
            raise
        return EngineFile(self, path_s, fd, int(size[0]), int(off_al[0]), int(mem_al[0]),
                          direct, crcs)

    @staticmethod
    def alloc(nbytes: int) -> np.ndarray:
        """See io_engine.alloc: an ALIGNMENT-aligned uint8 array."""
        return alloc(nbytes)

    # -- reads ----------------------------------------------------------------------------

    def submit(self, f: EngineFile, offsets: Any, lengths: Any, buf: Any,
               dest_offsets: Any) -> Handle:
        """Start reading lengths[i] bytes at offsets[i] of f into buf[dest_offsets[i]:];
        returns at once. buf must stay untouched until the handle is waited on."""
        self._check_open()
        fd = f.fileno()
        offsets = _int64_array("offsets", offsets)
        lengths = _int64_array("lengths", lengths)
        dests = _int64_array("dest_offsets", dest_offsets)
        if not len(offsets) == len(lengths) == len(dests):
            raise ValueError(f"offsets, lengths and dest_offsets differ in length: "
                             f"{len(offsets)}, {len(lengths)}, {len(dests)}")
        cbuf = ffi.from_buffer("uint8_t[]", buf, require_writable=True)
        _check_requests(f, offsets, lengths, dests, len(cbuf),
                        int(ffi.cast("uintptr_t", cbuf)))
        crcs = ffi.NULL if f.checksums is None else ffi.from_buffer("uint32_t[]", f.checksums)
        ncrcs = 0 if f.checksums is None else len(f.checksums)
        with self._lock:
            self._prune()
            batch = lib.gio_submit(self._eng, fd, f.size, ffi.from_buffer("int64_t[]", offsets),
                                   ffi.from_buffer("int64_t[]", lengths),
                                   ffi.from_buffer("int64_t[]", dests), cbuf, len(offsets),
                                   crcs, ncrcs)
            if batch == ffi.NULL:
                raise MemoryError("cannot allocate an I/O batch")
            # freed with the handle, so that threads still in wait() never see it go
            batch = ffi.gc(batch, lib.gio_batch_free)
            h = Handle(self, f, batch, offsets, lengths, (dests, cbuf, buf, crcs))
            self._inflight.add(h)
        return h

    def read_extents(self, f: EngineFile, offsets: Any, lengths: Any, buf: Any,
                     dest_offsets: Any) -> None:
        """submit, then wait."""
        self.submit(f, offsets, lengths, buf, dest_offsets).wait()

    def read_rows(self, f: EngineFile, rows: Any, row_bytes: int, offsets: Any, lengths: Any,
                  out: np.ndarray | None = None, staging: np.ndarray | None = None) -> np.ndarray:
        """Rows `rows` (any order) of a fixed-stride file (row r at r * row_bytes) read by
        the sorted page-aligned extents (offsets, lengths) that cover them, as the read
        planner plans them (gnnssd.sampler.readplan: one request per row, or merged runs);
        returns (len(rows), row_bytes) uint8 (`out` if given). `staging`: an Engine.alloc
        buffer holding two chunks of extents (default: 2 * chunk_bytes)."""
        rows = check_rows(f, rows, row_bytes)
        out = check_out(out, len(rows), row_bytes)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        if len(rows) == 0:
            return out
        order = None if np.all(rows[1:] >= rows[:-1]) else np.argsort(rows, kind="stable")
        ordered = rows if order is None else rows[order]
        if staging is None:
            staging = self.alloc(max(2 * self.chunk_bytes, 2 * int(lengths.max(initial=0))))
        for lo, hi, pos in self.iter_rows(f, ordered, row_bytes, offsets, lengths, staging):
            copy_rows(staging, pos, row_bytes, out if order is not None else out[lo:hi],
                      None if order is None else order[lo:hi])
        return out

    def iter_rows(self, f: EngineFile, rows: np.ndarray, row_bytes: int, offsets: np.ndarray,
                  lengths: np.ndarray, staging: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """The streaming form of read_rows for sorted int64 `rows`: yields (lo, hi, pos) per
        chunk of extents read, rows[lo:hi] then at staging[pos[k]:+row_bytes] until the
        next chunk is asked for."""
        chunks = RowChunks(f, rows, row_bytes, offsets, lengths, len(staging))

        def submit(k: int) -> tuple[Handle, np.ndarray]:
            offsets, lengths, dest = chunks.extents(k)
            return self.submit(f, offsets, lengths, staging, dest), dest

        pending = submit(0) if len(chunks) else None
        try:
            for k in range(len(chunks)):
                handle, dest = pending
                pending = submit(k + 1) if k + 1 < len(chunks) else None
                handle.wait()
                yield chunks.positions(k, dest)
        finally:
            if pending is not None:  # stopped early or failed: stop what is still queued
                pending[0].cancel()

    # -- life cycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel queued reads, wait for those in flight, stop the workers and free the
        rings. Handles still open then raise CancelledError from wait()."""
        with self._lock:
            eng, self._eng = self._eng, None
            handles = list(self._inflight)
        if eng is None:
            return
        lib.gio_engine_free(eng)
        for h in handles:
            h._finish()

    @property
    def closed(self) -> bool:
        return self._eng is None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_eng", None) is not None:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._eng is None else f"queue_depth={self.queue_depth}"
        return f"Engine(backend={self.backend!r}, {state})"

    def _check_open(self) -> None:
        if self._eng is None:
            raise ValueError("the I/O engine is closed")

    def _prune(self) -> None:
        """Let go of handles that finished without anyone waiting on them."""
        for h in [h for h in self._inflight if lib.gio_batch_done(h._batch)]:
            h._finish()

    def _cancel_file(self, f: EngineFile) -> None:
        with self._lock:
            handles = [h for h in self._inflight if h._file is f]
        for h in handles:
            h.cancel()
            h._drain()


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _requests_fine(f: EngineFile, offsets: np.ndarray, lengths: np.ndarray, dests: np.ndarray,
                   buf_bytes: int, buf_addr: int) -> bool:
    """Whether every request passes _check_requests' checks, decided by a few reductions (the
    checks one by one cost ~100 us of NumPy calls a submit, these ~15; tens of submits a
    mini-batch): True only where each check holds; anything else (a failure, or what these
    reductions do not decide: an empty request, a unit not a power of two) goes the check
    by check way, which names the first bad request."""
    align = f.mem_align if f.mem_align > 1 else 1
    unit = max(f.block_size, CHECKSUM_PAGE if f.checksums is not None else 1)
    if not (_power_of_two(unit) and _power_of_two(align)) or buf_addr % align:
        return False
    if lengths.min() <= 0 or offsets.min() < 0 or dests.min() < 0:
        return False
    limit = -(-f.size // f.block_size) * f.block_size
    if (offsets + lengths).max() > limit or (dests + lengths).max() > buf_bytes:
        return False
    return not ((int(np.bitwise_or.reduce(offsets)) | int(np.bitwise_or.reduce(lengths))) % unit
                or int(np.bitwise_or.reduce(dests)) % align)


def _check_requests(f: EngineFile, offsets: np.ndarray, lengths: np.ndarray,
                    dests: np.ndarray, buf_bytes: int, buf_addr: int) -> None:
    """Reject, before anything is submitted, what the kernel would fail or what would write
    outside buf: negative values, reads past EOF, destination overflow, misalignment."""
    if not len(offsets) or _requests_fine(f, offsets, lengths, dests, buf_bytes, buf_addr):
        return
    for name, arr in (("offset", offsets), ("length", lengths), ("dest_offset", dests)):
        i = _first(arr < 0)
        if i is not None:
            raise ValueError(f"request {i}: {name} {arr[i]} is negative")
    live = lengths > 0  # empty requests never reach the kernel
    bs = f.block_size
    # the last block may be read whole: the bytes after EOF come back as zeros
    limit = -(-f.size // bs) * bs
    i = _first(live & (offsets + lengths > limit))
    if i is not None:
        raise ValueError(f"request {i} reads past the end of {f.path}: offset {offsets[i]}"
                         f" + length {lengths[i]} > file size {f.size}")
    i = _first(live & (dests + lengths > buf_bytes))
    if i is not None:
        raise ValueError(f"request {i} overflows the buffer: dest_offset {dests[i]} + "
                         f"length {lengths[i]} > buffer size {buf_bytes}")
    units = [(bs, f"the block size O_DIRECT needs for {f.path}")] if bs > 1 else []
    if f.checksums is not None:
        units.append((CHECKSUM_PAGE, f"as {f.path} is opened with page checksums, reads "
                                     "cover whole pages"))
    for unit, why in units:
        for name, arr in (("offset", offsets), ("length", lengths)):
            i = _first(live & (arr % unit != 0))
            if i is not None:
                raise ValueError(f"request {i}: {name} {arr[i]} is not a multiple of {unit}, {why}")
    if f.mem_align > 1:
        i = _first(live & ((buf_addr + dests) % f.mem_align != 0))
        if i is not None:
            raise ValueError(
                f"request {i}: destination address {buf_addr + int(dests[i]):#x} (dest_offset"
                f" {dests[i]}) is not a multiple of {f.mem_align}, the memory alignment"
                f" O_DIRECT needs; allocate with Engine.alloc")
