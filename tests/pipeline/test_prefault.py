"""The loader's long-lived arrays faulted in ahead of use: every page resident afterwards
(the kernel's own count, mincore), no byte changed, the x array reserved at open the one
the first mini-batch uses."""
from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from gnnssd.pipeline import Recycler
from gnnssd.pipeline.prefault import populate, populate_in_background

PAGE = mmap.PAGESIZE


def _resident_pages(array: np.ndarray) -> int:
    """Pages of `array` (page-aligned) in memory, as mincore(2) reports them."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = -(-array.nbytes // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


def _fresh(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """A new anonymous mapping (no page touched yet) and its bytes as an array."""
    region = mmap.mmap(-1, nbytes)
    return region, np.frombuffer(region, np.uint8)


def test_populate_makes_every_page_resident_and_changes_no_byte():
    region, array = _fresh(256 * PAGE)
    array[5 * PAGE : 5 * PAGE + 3] = [7, 8, 9]  # one page written before
    before = _resident_pages(array)
    assert before < 256
    if not populate(array):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14): pages fault on first touch")
    assert _resident_pages(array) == 256
    expected = np.zeros(256 * PAGE, np.uint8)
    expected[5 * PAGE : 5 * PAGE + 3] = [7, 8, 9]
    np.testing.assert_array_equal(array, expected)
    del array
    region.close()


def test_populate_in_background_covers_each_array_and_keeps_a_write_made_meanwhile():
    regions = [mmap.mmap(-1, 128 * PAGE) for _ in range(3)]
    arrays = [np.frombuffer(region, np.uint8) for region in regions]
    thread = populate_in_background(arrays)
    arrays[1][-1] = 42  # the caller may write while the kernel fills pages: nothing is overwritten
    thread.join(timeout=30)
    assert not thread.is_alive()
    if populate(arrays[0]):
        assert [_resident_pages(a) for a in arrays] == [128, 128, 128]
    assert arrays[1][-1] == 42 and int(arrays[1][:-1].max()) == 0
    del arrays, thread
    for region in regions:
        region.close()


def test_the_reserved_x_array_is_the_one_the_first_minibatch_takes():
    pool = Recycler(keep=2)
    reserved = pool.reserve(1000 * 16 * 4)
    assert reserved.nbytes == Recycler.array_bytes(1000 * 16 * 4)
    address = reserved.ctypes.data
    del reserved  # the pool's alone now, as the loader leaves it
    assert pool.reserve(1000 * 16 * 4) is None  # one only
    a = pool.take(1000, 16, np.float32)
    assert a.ctypes.data == address and len(pool._arrays) == 1
    b = pool.take(990, 16, np.float32)  # a held: a second array, kept
    assert b.ctypes.data != address and len(pool._arrays) == 2
