"""The store: round trips against the input arrays, orders, dtypes, checksums and refusal."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from gnnssd.datasets import ArraySource
from gnnssd.sampler import node_order
from gnnssd.storage_format import PageChecksumError, Store, StoreError, write_store
from gnnssd.storage_format.preprocess.csc import csc_from_edges, renumber_csc

from tests.conftest import random_graph_arrays


@pytest.mark.parametrize("order", ["original", "degree", "locality"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_round_trip_matches_input(tmp_path, order, dtype):
    data = random_graph_arrays()
    store = Store.open(write_store(tmp_path / "s", ArraySource(**data), order=node_order(order), dtype=dtype),
                       verify=True)
    n = 300
    # Features and labels, looked up through the node order, equal the input.
    feats = store.features_memmap()
    assert feats.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(feats[store.inv], data["features"].astype(dtype))
    np.testing.assert_array_equal(store.labels[store.inv], data["labels"])
    np.testing.assert_array_equal(store.perm[store.inv], np.arange(n))
    # Topology: the CSC in store IDs equals SciPy's CSC of the relabelled, de-duplicated edges.
    src, dst = data["edges"]
    ref = sp.coo_matrix((np.ones(len(src)), (store.inv[src], store.inv[dst])), shape=(n, n)).tocsc()
    ref.sum_duplicates()
    ref.sort_indices()
    np.testing.assert_array_equal(store.indptr, ref.indptr)
    np.testing.assert_array_equal(store.indices, ref.indices)
    for name in ("train", "valid", "test"):
        np.testing.assert_array_equal(np.sort(store.split(name)),
                                      np.sort(data["splits"][name]))
    # features.bin: rows from offset 0, padded to whole 4 KiB pages.
    assert store.features_path.stat().st_size % 4096 == 0
    assert store.row_bytes == 8 * np.dtype(dtype).itemsize


def test_degree_order_puts_most_referenced_first(tmp_path):
    store = Store.open(write_store(tmp_path / "s", ArraySource(**random_graph_arrays()), order=node_order("degree")))
    freq = np.bincount(store.indices, minlength=store.num_nodes)
    assert np.all(np.diff(freq) <= 0)


def test_symmetric_source_adds_reverse_edges(tmp_path):
    data = random_graph_arrays(num_edges=500)
    store = Store.open(write_store(tmp_path / "s", ArraySource(**data, symmetric=True)))
    adj = sp.csc_matrix((np.ones(store.num_edges), store.indices, store.indptr), shape=(300, 300))
    assert abs(adj - adj.T).sum() == 0
    assert store.num_edges > 500  # reverse edges were added (minus duplicates)


def test_renumber_csc_is_relabelling():
    rng = np.random.default_rng(1)
    src, dst = rng.integers(50, size=400), rng.integers(50, size=400)
    indptr, indices = csc_from_edges(src, dst, 50)
    perm = rng.permutation(50)
    inv = np.argsort(perm)
    new_indptr, new_indices = renumber_csc(indptr, indices, perm, inv)
    direct = csc_from_edges(inv[src], inv[dst], 50)
    np.testing.assert_array_equal(new_indptr, direct[0])
    np.testing.assert_array_equal(new_indices, direct[1])


@pytest.fixture()
def store_dir(tmp_path):
    return write_store(tmp_path / "s", ArraySource(**random_graph_arrays()))


def test_missing_manifest_is_refused(store_dir):
    (store_dir / "manifest.json").unlink()
    with pytest.raises(StoreError, match="manifest.json: missing"):
        Store.open(store_dir)


def test_truncated_file_is_refused(store_dir):
    path = store_dir / "features.bin"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 4096)
    with pytest.raises(StoreError, match="features.bin: size"):
        Store.open(store_dir)


@pytest.mark.parametrize("name", ["indices.npy", "labels.npy", "features.bin"])
def test_bit_flip_is_caught(store_dir, name):
    path = store_dir / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    if name == "features.bin":  # not read whole at open: caught by verify, page by page
        store = Store.open(store_dir)
        with pytest.raises(PageChecksumError,
                           match=rf"features.bin: page {len(data) // 2 // 4096} "):
            store.verify()
    else:
        with pytest.raises(StoreError, match=f"{name}: checksum mismatch"):
            Store.open(store_dir)


def test_unknown_format_version_is_refused(store_dir):
    manifest = json.loads((store_dir / "manifest.json").read_text())
    manifest["format_version"] = 99
    (store_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="format_version 99"):
        Store.open(store_dir)


def test_rewrite_replaces_store_atomically(tmp_path):
    first = random_graph_arrays(seed=0)
    second = random_graph_arrays(seed=1)
    out = write_store(tmp_path / "s", ArraySource(**first))
    write_store(out, ArraySource(**second))
    store = Store.open(out, verify=True)
    np.testing.assert_array_equal(store.features_memmap(), second["features"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


STREAMING_SCRIPT = """
import resource, sys, numpy as np
from gnnssd.datasets import ArraySource
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store
folder, n, dim, order = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(folder + '/feats.bin', 'wb') as f:
    for lo in range(0, n, 100_000):
        rows = min(100_000, n - lo)
        f.write(np.random.default_rng(lo).standard_normal((rows, dim), dtype=np.float32).tobytes())
feats = np.memmap(folder + '/feats.bin', dtype=np.float32, mode='r', shape=(n, dim))
rng = np.random.default_rng(0)
edges = (rng.integers(n, size=n), rng.integers(n, size=n))
write_store(folder + '/store', ArraySource(feats, edges, np.zeros(n, dtype=np.int64),
                                            {'train': np.arange(10)}), order=node_order(order))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _peak_rss_of_preprocess(folder, n: int, dim: int, order: str) -> int:
    folder.mkdir()
    out = subprocess.run([sys.executable, "-c", STREAMING_SCRIPT, str(folder), str(n), str(dim), order],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1])


@pytest.mark.parametrize("order", ["original", "degree"])
def test_writer_memory_does_not_grow_with_features(tmp_path, order):
    """Same graph, features 16x wider (32 MiB vs 512 MiB): peak RSS barely moves."""
    n = 1 << 20
    narrow = _peak_rss_of_preprocess(tmp_path / "narrow", n, 8, order)
    wide = _peak_rss_of_preprocess(tmp_path / "wide", n, 128, order)
    growth = wide - narrow
    assert growth < 96 << 20, f"peak RSS grew by {growth / 2**20:.0f} MiB for 480 MiB more features"
