"""The out-of-core CSC build against the in-memory one: same arrays, same file bytes."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.datasets import ArraySource
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store
from gnnssd.storage_format.preprocess.csc import bucket_bounds, csc_from_edges
from gnnssd.storage_format.preprocess.csc_external import external_csc, prefetched

from tests.conftest import random_graph_arrays


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bucket_edges", [1, 37, 10_000])
def test_external_equals_in_memory(tmp_path, symmetric, bucket_edges):
    """Many buckets (a hub larger than a bucket included), repeated edges, self-loops."""
    rng = np.random.default_rng(3)
    n, e = 400, 6000
    src = rng.integers(n, size=e)
    dst = np.where(rng.random(e) < 0.2, 7, rng.zipf(1.7, e) % n)  # node 7: a hub
    src[:50] = dst[:50]
    ref_indptr, ref_indices = csc_from_edges(src, dst, n, symmetric=symmetric)
    chunks = lambda: ((src[lo:lo + 999], dst[lo:lo + 999]) for lo in range(0, e, 999))  # noqa: E731
    indptr, indices = external_csc(chunks, n, symmetric, bucket_edges, tmp_path / "scratch",
                                   tmp_path / "indices.npy")
    np.testing.assert_array_equal(indptr, ref_indptr)
    np.testing.assert_array_equal(indices, ref_indices)
    np.save(tmp_path / "ref.npy", ref_indices)
    assert (tmp_path / "ref.npy").read_bytes() == (tmp_path / "indices.npy").read_bytes()
    assert not (tmp_path / "scratch").exists()


def test_bucket_bounds_cover_nodes_within_the_bucket_size():
    degrees = np.array([3, 0, 9, 1, 1, 1, 0, 4])
    indptr = np.concatenate([[0], np.cumsum(degrees)])
    bounds = bucket_bounds(indptr, 4)
    assert bounds[0] == 0 and bounds[-1] == len(degrees)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        assert indptr[hi] - indptr[lo] <= 4 or hi - lo == 1
        if hi < len(degrees):  # greedy: the next node would not have fitted
            assert indptr[hi + 1] - indptr[lo] > 4


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("order", ["original", "degree"])
def test_store_files_identical_with_and_without_memory_limit(tmp_path, symmetric, order):
    data = random_graph_arrays(num_edges=4000)
    stores = {limit: write_store(tmp_path / str(limit), ArraySource(**data, symmetric=symmetric),
                                 order=node_order(order), memory_limit=limit) for limit in (1, 1 << 30)}
    for name in ("indptr.npy", "indices.npy", "perm.npy", "labels.npy", "features.bin"):
        assert (stores[1] / name).read_bytes() == (stores[1 << 30] / name).read_bytes(), name
    assert sorted(p.name for p in stores[1].iterdir()) == sorted(p.name for p in stores[1 << 30].iterdir())


def test_edge_stream_errors_name_the_edge(tmp_path):
    data = random_graph_arrays(num_edges=3000)
    data["edges"][1][2500] = 300
    with pytest.raises(ValueError, match="edge 2500 has destination 300, outside the node range"):
        write_store(tmp_path / "s", ArraySource(**data), memory_limit=1)
    assert not (tmp_path / "s").exists()


def test_prefetched_keeps_order_and_raises_the_producers_error():
    assert list(prefetched(iter(range(10)))) == list(range(10))

    def failing():
        yield 1
        raise OSError("disk gone")

    out = []
    with pytest.raises(OSError, match="disk gone"):
        for item in prefetched(failing()):
            out.append(item)
    assert out == [1]


PREPROCESS_SCRIPT = """
import re, sys
from gnnssd.datasets import IGBSource
from gnnssd.storage_format import write_store
from gnnssd.storage_format.preprocess import topology
topology.CHUNK_EDGES = 1 << 17  # both graphs span many chunks: the read-ahead queue is full in both
write_store(sys.argv[1] + '/store', IGBSource(sys.argv[1]), memory_limit=int(sys.argv[2]))
# VmHWM, not ru_maxrss: the latter keeps the parent's RSS from before exec.
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024)
"""


def write_igb_graph(root, num_nodes: int, num_edges: int) -> None:
    """A minimal IGB layout with random (E, 2) edges, written a block at a time."""
    paper = root / "small" / "processed" / "paper"
    cites = root / "small" / "processed" / "paper__cites__paper"
    paper.mkdir(parents=True)
    cites.mkdir(parents=True)
    np.save(paper / "node_feat.npy", np.zeros((num_nodes, 4), np.float32))
    np.save(paper / "node_label_19.npy", np.zeros(num_nodes, np.float32))
    edges = np.lib.format.open_memmap(cites / "edge_index.npy", "w+", np.int64, (num_edges, 2))
    rng = np.random.default_rng(0)
    for lo in range(0, num_edges, 1 << 20):
        edges[lo:lo + (1 << 20)] = rng.integers(num_nodes, size=(min(1 << 20, num_edges - lo), 2))
    edges.flush()


def peak_rss_growth(tmp_path, memory_limit: int) -> int:
    """Peak RSS of preprocessing 4M edges minus that of 512K edges (65,536 nodes)."""
    import subprocess
    import sys

    peaks = []
    for edges in (1 << 19, 4 << 20):
        folder = tmp_path / f"{memory_limit}-{edges}"
        write_igb_graph(folder, 1 << 16, edges)
        out = subprocess.run([sys.executable, "-c", PREPROCESS_SCRIPT, str(folder), str(memory_limit)],
                             check=True, capture_output=True, text=True).stdout
        peaks.append(int(out.split()[-1]))
    return peaks[1] - peaks[0]


def test_out_of_core_memory_does_not_grow_with_edges(tmp_path):
    """8x the edges under the out-of-core build: peak RSS stays put (edges read through
    per-chunk mappings, sorted in small buckets), where the in-memory build grows by the
    edge list (checked too, so that the measurement can tell the two apart)."""
    bounded = peak_rss_growth(tmp_path, memory_limit=1)
    in_memory = peak_rss_growth(tmp_path, memory_limit=1 << 40)
    assert bounded < 24 << 20, f"peak RSS grew by {bounded / 2**20:.0f} MiB for 3.5M more edges"
    assert in_memory > 64 << 20, f"in memory, 3.5M more edges added only {in_memory / 2**20:.0f} MiB"
