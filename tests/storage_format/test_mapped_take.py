"""storage_format.mapped_take: a lookup in a memory-mapped node-sized array (perm, inv,
labels) equal to NumPy's indexing, without leaving the mapping's pages in the RSS."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnssd.storage_format import mapped_take, release_pages

MiB = 1 << 20


def mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of `path` (/proc/self/smaps)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                ours = len(head) > 5 and head[5] == str(path)
            elif ours and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


@pytest.fixture
def mapped(tmp_path):
    """A 32 MiB int64 .npy (4M entries, a permutation) mapped read-only, as Store maps perm.npy."""
    path = tmp_path / "perm.npy"
    np.save(path, np.random.default_rng(0).permutation(4 << 20).astype(np.int64))
    return path, np.load(path, mmap_mode="r")


@pytest.mark.parametrize("count", [0, 1, 4096, 4097, 300_000])
def test_equals_numpy_indexing_in_any_order(mapped, count):
    path, array = mapped
    ids = np.random.default_rng(count).integers(0, len(array), count)
    assert np.array_equal(mapped_take(array, ids, window=MiB), np.asarray(array)[ids])


@pytest.mark.parametrize("window", [8 * MiB, 12 * MiB, 16 * MiB])
def test_a_lookup_of_few_windows_equals_numpy_indexing_and_leaves_no_pages(mapped, window):
    """4, 3 (the last one partial) and 2 windows: a pass over the IDs per window
    (mapping.FEW_WINDOWS), the mapping released after each one as with many windows."""
    path, array = mapped
    ids = np.random.default_rng(window).integers(0, len(array), 300_000)
    expected = np.asarray(array)[ids]
    release_pages(array)
    assert np.array_equal(mapped_take(array, ids, window=window), expected)
    assert mapped_rss(path) == 0


def test_a_window_pass_takes_only_the_ids_of_its_range():
    """kernels.take_range: out[i] for the IDs in [lo, hi) only, other entries untouched."""
    from gnnssd.storage_format import kernels

    values = np.arange(100, 200, dtype=np.int64)
    ids = np.array([5, 70, 30, 99, 0, 31], np.int64)
    out = np.full(len(ids), -1, np.int64)
    kernels.take_range(values, ids, 30, 71, out)
    assert out.tolist() == [-1, 170, 130, -1, -1, 131]


def test_keeps_the_shape_and_dtype_of_the_ids_and_the_array(tmp_path):
    path = tmp_path / "labels.npy"
    np.save(path, np.arange(1 << 20, dtype=np.int16) % 300)
    array = np.load(path, mmap_mode="r")
    ids = np.random.default_rng(1).integers(0, len(array), (100, 70))
    out = mapped_take(array, ids, window=64 << 10)
    assert out.dtype == np.int16 and out.shape == (100, 70)
    assert np.array_equal(out, np.asarray(array)[ids])


def test_an_array_in_memory_is_indexed():
    array = np.arange(10, 20)
    assert np.array_equal(mapped_take(array, np.array([3, 0, 9])), [13, 10, 19])


def test_leaves_no_pages_of_the_mapping_resident(mapped):
    path, array = mapped
    ids = np.random.default_rng(2).integers(0, len(array), 200_000)  # every page of the file
    np.asarray(array)[ids]  # plain indexing: the whole mapping stays resident
    assert mapped_rss(path) > 24 * MiB
    release_pages(array)
    assert mapped_rss(path) == 0
    mapped_take(array, ids, window=MiB)
    assert mapped_rss(path) == 0
    mapped_take(array, ids[:100], window=MiB)
    assert mapped_rss(path) == 0


def peak_rise(run) -> int:
    """How far the RSS peak (VmHWM, file pages included) rose above the RSS while `run` ran."""
    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS:")
    run()
    return status("VmHWM:") - before


def test_a_few_ids_map_no_more_than_a_window_at_once(mapped):
    """4,000 IDs of a 32 MiB file: indexed at once, each fault maps 64 KiB or more around its
    ID (a whole folio on recent kernels), so nearly the whole file is resident at once."""
    path, array = mapped
    ids = np.random.default_rng(3).integers(0, len(array), 4000)
    assert peak_rise(lambda: np.asarray(array)[ids]) > 16 * MiB
    release_pages(array)
    assert peak_rise(lambda: mapped_take(array, ids, window=MiB)) < 6 * MiB
    assert mapped_rss(path) == 0


def test_an_id_out_of_range_is_refused_naming_it(mapped):
    path, array = mapped
    ids = np.arange(5000)
    ids[1234] = len(array)
    with pytest.raises(IndexError, match=str(len(array))):
        mapped_take(array, ids)
    ids[1234] = -3
    with pytest.raises(IndexError, match="-3"):
        mapped_take(array, ids)
