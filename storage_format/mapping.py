"""Memory-mapped arrays read in passes, with their resident pages kept bounded.

A pass over a mapped file larger than memory would otherwise leave every page it touched
mapped into the process (counted in its RSS, though the kernel may reclaim it): after each
chunk, `release_pages` drops the mapping's pages (they stay in the page cache).
"""
from __future__ import annotations

import io
import mmap
from collections.abc import Iterator

import numpy as np


def release_pages(array: np.ndarray) -> None:
    """Unmap the resident pages of `array`'s file mapping, if it has one (a no-op for
    arrays in memory); the next access faults them back from the page cache."""
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    raw = getattr(base, "_mmap", None)
    if raw is not None:
        raw.madvise(mmap.MADV_DONTNEED)


def released_chunks(length: int, chunk: int, *mapped: np.ndarray) -> Iterator[slice]:
    """Slices of `chunk` elements over `length`; after each one the `mapped` arrays' pages
    are released, so a pass over a file larger than memory does not stay in the RSS."""
    for lo in range(0, length, chunk):
        yield slice(lo, min(lo + chunk, length))
        for array in mapped:
            release_pages(array)


def npy_header(dtype: np.dtype, length: int) -> bytes:
    """The header np.save writes for a 1-D C-order array of `length` items."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": False, "shape": (length,)})
    return buffer.getvalue()
