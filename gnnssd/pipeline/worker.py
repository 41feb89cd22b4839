"""Background planning: run a plan pipeline in a thread, ahead of use, through a bounded queue.

A thread suffices: the sampling and copy kernels are numba with nogil, so planning overlaps
training.

An item can be long (a repack window: the plans of many mega-batches, then a scan of
features.bin), so closing a worker does not wait for it: the stages call `check_stop()`
between chunks of their work, which raises `Stopped` in a worker's thread once the worker
is closing (Ctrl-C at papers scale returns in a chunk's time, not a window's).
"""
from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Callable, Generic, Iterable, Iterator, TypeVar

import numba


T = TypeVar("T")
_DONE = object()
#: Seconds between looks at the stop flag while a worker or its consumer waits.
POLL_S = 0.1
_running = threading.local()  # .stop: the stop flag of the worker whose thread this is


class Stopped(Exception):
    """Raised at a `check_stop()` in a worker's thread once the worker is closing."""


def check_stop() -> None:
    """Raise Stopped if this thread runs a PlanWorker that is closing (elsewhere: nothing).
    Long stages call it between chunks."""
    stop = getattr(_running, "stop", None)
    if stop is not None and stop.is_set():
        raise Stopped


@contextmanager
def stops_with(flag: threading.Event) -> Iterator[None]:
    """Make `flag` the stop flag that `check_stop()` reads in this thread."""
    _running.stop = flag
    try:
        yield
    finally:
        _running.stop = None


def numba_threads(count: int) -> int:
    """Run this thread's numba parallel kernels on `count` threads (0: numba's whole pool,
    NUMBA_NUM_THREADS); numba's setting belongs to the calling thread, so every thread that
    runs kernels calls this. Returns the count it replaced (to restore it)."""
    previous = numba.get_num_threads()
    numba.set_num_threads(count or numba.config.NUMBA_NUM_THREADS)
    return previous


def check_numba_threads(count: int, key: str) -> None:
    """Refuse a thread count above numba's pool (fixed at start by NUMBA_NUM_THREADS)."""
    if count > numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"{key}: {count} threads, but numba's pool has {numba.config.NUMBA_NUM_THREADS} "
                         "(NUMBA_NUM_THREADS; set it in the environment before the process starts)")


class PlanWorker(Generic[T]):
    """Iterates `source` in a background thread.

    At most `depth` items exist at once: the one the consumer holds (until it asks for the
    next), those queued and the one being made. With repack windows as items and depth 2,
    the next window is repacked while the current one trains, and no more.

    `counted(item)` says which items count toward `depth` (default: all). The others pass
    without a slot: with plans as items, the pieces of a mini-batch before its last (a few
    rows each: Planner's piece plans) count as one plan with it, so the planner samples a
    whole mini-batch ahead of the reads, not one piece (at 1/8 of `medium`, a mini-batch is
    read in 11 pieces, and the next one's sampling began only as its last piece was read,
    so the reads waited for it: docs/BENCHMARKS.md, issue 46, ninth round).
    """

    def __init__(self, source: Iterable[T], depth: int = 2, name: str = "gnnssd-worker", threads: int | None = None,
                 counted: Callable[[T], bool] | None = None):
        """`threads`: the numba threads of the kernels `source` runs (numba_threads;
        None: numba's default)."""
        self._numba_threads = threads
        self._counted = counted or (lambda item: True)
        self._queue: queue.Queue = queue.Queue()
        self._slots = threading.Semaphore(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iter(source),), daemon=True, name=name)
        self._thread.start()

    def _run(self, source: Iterator[T]) -> None:
        try:
            if self._numba_threads is not None:
                numba_threads(self._numba_threads)
            with stops_with(self._stop):
                while True:
                    while not self._slots.acquire(timeout=POLL_S):
                        if self._stop.is_set():
                            return
                    if self._stop.is_set():
                        return
                    item = next(source, _DONE)
                    if item is not _DONE and not self._counted(item):
                        self._slots.release()  # it passes without a slot
                    self._queue.put(item)
                    if item is _DONE:
                        return
        except BaseException as e:  # handed to the consumer, raised there
            self._queue.put(e)

    def __iter__(self) -> Iterator[T]:
        """The items in order; a consumer that is itself a worker's stage stops waiting
        (and taking items) once its own worker is closing."""
        while True:
            check_stop()
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            counted = self._counted(item)
            yield item
            del item  # the consumer is done with it: not held while the next one is made
            if counted:
                self._slots.release()

    def close(self) -> None:
        """Stop the worker and wait for it: the item in progress stops at its next
        `check_stop()` (or, in a stage that never checks, when it is made)."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "PlanWorker[T]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
