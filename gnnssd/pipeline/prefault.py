"""The loader's long-lived arrays made resident ahead of their first use, off the caller's thread.

A fresh array's pages fault on first touch. On a virtual machine whose host took freed
memory back, that costs ~3 ms a MiB: the first mini-batch's x (an array of ~240 MiB on
`medium`) took 0.5-0.9 s of faults inside its gather, a third of the first mini-batch's wait
(docs/BENCHMARKS.md, issue 46, sixth round). The kernel fills them instead
(madvise MADV_POPULATE_WRITE, Linux 5.14) from a thread of its own while the loader plans and
reads. The call changes no byte of the array, so the array may be used at once, while it runs.
Where the kernel lacks it, pages fault on first touch as before.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import threading

import numpy as np

log = logging.getLogger("gnnssd")

#: madvise's advice number (linux/mman.h): fault in every page of a range, writable, its
#: contents unchanged.
MADV_POPULATE_WRITE = 23


@functools.cache
def _madvise():
    madvise = getattr(ctypes.CDLL(None, use_errno=True), "madvise", None)
    if madvise is not None:
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def _pages(array: np.ndarray) -> tuple[int, int]:
    """The whole pages of `array`'s memory (C-contiguous): start address and length."""
    page = mmap.PAGESIZE
    start = -(-array.ctypes.data // page) * page
    return start, max(0, (array.ctypes.data + array.nbytes) // page * page - start)


def _populate_pages(start: int, length: int) -> bool:
    madvise = _madvise()
    if madvise is None or length == 0:
        return False
    if madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_POPULATE_WRITE) != 0:
        log.debug("prefault: madvise(MADV_POPULATE_WRITE) refused (errno %d); pages fault on first touch",
                  ctypes.get_errno())
        return False
    return True


def populate(array: np.ndarray) -> bool:
    """Fault in the whole pages of `array` (C-contiguous) now; whether the kernel did."""
    return _populate_pages(*_pages(array))


def populate_in_background(arrays: list[np.ndarray]) -> threading.Thread:
    """`populate` each of `arrays` in a daemon thread (ctypes releases the GIL for the call);
    the thread is returned, started. It holds their addresses, not the arrays: a reference
    would keep a Recycler from handing them out meanwhile. An array freed before its turn
    is harmless: madvise fails on memory no longer mapped, and changes no byte of memory
    mapped again there."""
    ranges = [_pages(array) for array in arrays]

    def run() -> None:
        for start, length in ranges:
            if not _populate_pages(start, length):
                return

    thread = threading.Thread(target=run, daemon=True, name="gnnssd-prefault")
    thread.start()
    return thread
