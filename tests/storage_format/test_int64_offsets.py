"""Edge offsets past 2^31 and file offsets past 2^32, without the disk they would take: the
arrays and files are sparse (holes read as zeros and cost nothing), and only the rows
under test hold data. Every kernel that indexes edges must use 64-bit offsets."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnssd.io_engine import Engine
from gnnssd.sampler import NeighborSampler
from gnnssd.sampler.readplan import per_row_requests
from gnnssd.sampler.sampling import csc_edge_ids
from gnnssd.storage_format.mapping import npy_header

BIG = 2**31 + 5  # edges of node 0: the rows after it start past int32's range


def _sparse_npy(path: Path, dtype: np.dtype, length: int) -> np.memmap:
    """An .npy file of `length` zeros that occupies (almost) no disk."""
    header = npy_header(np.dtype(dtype), length)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + length * np.dtype(dtype).itemsize)
    return np.load(path, mmap_mode="r+")


@pytest.fixture(scope="module")
def big_graph(tmp_path_factory):
    """12 nodes; node 0 has BIG in-edges (all from node 0: the holes), nodes 1..10 have 8
    each, stored past offset 2^31, node 11 none."""
    path = tmp_path_factory.mktemp("big") / "indices.npy"
    degrees = np.array([BIG] + [8] * 10 + [0], dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(degrees)])
    indices = _sparse_npy(path, np.int32, int(indptr[-1]))
    rng = np.random.default_rng(0)
    for v in range(1, 11):
        indices[indptr[v]:indptr[v + 1]] = np.sort(rng.choice(np.arange(1, 12), 8, replace=False))
    indices.flush()
    return indptr, np.load(path, mmap_mode="r")


def test_sampling_rows_beyond_2_31(big_graph):
    indptr, indices = big_graph
    seeds = np.arange(1, 11)
    full = NeighborSampler(indptr, indices, [-1]).sample(seeds, seed=0)
    for k, v in enumerate(seeds):
        row = np.asarray(indices[indptr[v]:indptr[v + 1]])
        src = full.edge_src[full.edge_dst == k]
        np.testing.assert_array_equal(np.sort(full.nodes[src]), row)
    some = NeighborSampler(indptr, indices, [3]).sample(seeds, seed=1)
    for k, v in enumerate(seeds):
        src = some.nodes[some.edge_src[some.edge_dst == k]]
        assert len(src) == 3 and set(src) <= set(indices[indptr[v]:indptr[v + 1]].tolist())


def test_edge_ids_beyond_2_31(big_graph):
    indptr, indices = big_graph
    v = 5
    u = int(indices[indptr[v] + 2])
    ids = csc_edge_ids(indptr, indices, np.array([[u, v]]))
    assert int(indptr[v] + 2) in ids.tolist() and ids.min() >= 2**31


def test_engine_reads_rows_past_4_gib(tmp_path):
    """A sparse features file of 5 GiB: rows written near its end come back through the
    io_engine's one-request-per-row reads exactly as os.pread returns them."""
    row_bytes = 512
    path = tmp_path / "features.bin"
    rows = np.array([2**32 // row_bytes + 3, (5 << 30) // row_bytes - 2], dtype=np.int64)
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, (len(rows), row_bytes), dtype=np.uint8)
    with open(path, "wb") as f:
        f.truncate(5 << 30)
        for r, d in zip(rows.tolist(), data):
            f.seek(r * row_bytes)
            f.write(d.tobytes())
    with Engine() as engine, engine.open(path, direct=False) as f:
        offsets, lengths = per_row_requests(rows, row_bytes)
        assert offsets.min() >= 2**32
        got = engine.read_rows(f, rows, row_bytes, offsets, lengths)
    np.testing.assert_array_equal(got, data)
