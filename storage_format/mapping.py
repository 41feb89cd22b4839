"""Memory-mapped arrays read in passes, with their resident pages kept bounded.

A pass over a mapped file larger than memory would otherwise leave every page it touched
mapped into the process (counted in its RSS, though the kernel may reclaim it): after each
chunk, `release_pages` drops the mapping's pages (they stay in the page cache).
"""
from __future__ import annotations

import ctypes
import io
import mmap
from collections.abc import Iterator

import numpy as np

#: Bytes of a mapped array a lookup (`mapped_take`) leaves resident at once.
LOOKUP_WINDOW = 16 << 20
#: Up to this many windows, a lookup passes over all the IDs once per window instead of
#: grouping them by window first: 414k IDs into a 20 MB perm.npy (2 windows) took 5 ms this way
#: against 19 ms grouped; the two are even near 10 windows (docs/BENCHMARKS.md, issue 46's
#: fourth round).
FEW_WINDOWS = 8

_libc = ctypes.CDLL(None, use_errno=True)


def _memmap_of(array: np.ndarray) -> np.memmap | None:
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return base


def release_pages(array: np.ndarray) -> None:
    """Unmap the resident pages of `array`'s file mapping, if it has one (a no-op for
    arrays in memory); the next access faults them back from the page cache."""
    raw = getattr(_memmap_of(array), "_mmap", None)
    if raw is not None:
        raw.madvise(mmap.MADV_DONTNEED)


def _release_span(view: np.ndarray) -> None:
    """Unmap the resident pages under `view`, a contiguous part of a file mapping (its
    first and last pages whole: they belong to the same mapping)."""
    start = view.ctypes.data - view.ctypes.data % mmap.PAGESIZE
    end = view.ctypes.data + view.nbytes
    _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


def mapped_take(array: np.ndarray, ids: np.ndarray, window: int = LOOKUP_WINDOW) -> np.ndarray:
    """array[ids] for a 1-D `array`, leaving no more than `window` bytes of its file mapping
    resident in the process (an array in memory is simply indexed). A random lookup of
    many IDs touches nearly every page of a node-sized file (perm.npy at 10^8 nodes: 0.8
    GiB), which would then stay in the RSS: the IDs are taken window by window of the
    array, each window's pages released after its lookups (they stay in the page cache).
    Even a few IDs go by window: a fault maps the page cache's whole folio around its ID
    (up to 1 MiB on Linux 6.18: a mini-batch's 1,024 labels mapped 435 MiB at once). An
    array no larger than a window is indexed at once, its pages released after."""
    ids = np.asarray(ids)
    if _memmap_of(array) is None:
        return array[ids]
    flat = ids.reshape(-1)
    if not flat.size:
        return np.empty(ids.shape, array.dtype)
    if flat.min() < 0 or flat.max() >= len(array):
        bad = flat[(flat < 0) | (flat >= len(array))][0]
        raise IndexError(f"index {bad} is out of bounds for a mapped array of {len(array)} items")
    if array.nbytes <= window:  # the whole mapping fits the window: no pass needed (nor numba's start-up)
        out = array.view(np.ndarray)[flat]
        release_pages(array)
        return out.reshape(ids.shape)
    per = max(1, window // array.itemsize)
    flat = flat.astype(np.int64, copy=False)
    from . import kernels  # numba, loaded on the first lookup of a mapped array

    windows = -(-len(array) // per)
    out = np.empty(len(flat), array.dtype)
    values = array.view(np.ndarray)
    if windows <= FEW_WINDOWS:
        for w in range(windows):
            kernels.take_range(values, flat, w * per, (w + 1) * per, out)
            _release_span(array[w * per:(w + 1) * per])
    else:
        order, bounds = kernels.by_window(flat, per, windows)
        for w in range(windows):
            if bounds[w] < bounds[w + 1]:
                kernels.take_window(values, flat, order, bounds[w], bounds[w + 1], out)
                _release_span(array[w * per:(w + 1) * per])
    release_pages(array)  # what a folio across a window's edge mapped beyond it
    return out.reshape(ids.shape)


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
