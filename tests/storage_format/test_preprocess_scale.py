"""Preprocess at scale, on small inputs: the synthetic generator's kernel against NumPy,
the out-of-core steps against their in-memory references, and resume after an
interruption in every step giving the same store, byte for byte."""
from __future__ import annotations

import numpy as np
import pytest

from gnnssd.datasets import ArraySource, synthetic_source
from gnnssd.datasets.synthetic import _weighted_position
from gnnssd.sampler import node_order
from gnnssd.sampler import order as sampler_order
from gnnssd.storage_format import Store, write_store
from gnnssd.storage_format.preprocess import features, reorder, topology, writer
from gnnssd.storage_format.preprocess.csc import csc_from_edges, renumber_csc, renumber_csc_to_file
from gnnssd.storage_format.preprocess.csc_external import external_csc

from tests.hetero_graph import ToyHeteroSource

from tests.conftest import random_graph_arrays


def test_weighted_position_is_searchsorted_within_the_range():
    rng = np.random.default_rng(0)
    cum = np.cumsum(rng.pareto(1.5, 5000) + 1)
    for steps in (1, 7, 4096):
        table = np.searchsorted(cum, np.arange(steps + 1) * (cum[-1] / steps), side="right")
        for _ in range(300):
            lo = int(rng.integers(0, len(cum)))
            hi = int(rng.integers(lo + 1, len(cum) + 1))
            lo_w = cum[lo - 1] if lo else 0.0
            x = lo_w + rng.random() * (cum[hi - 1] - lo_w)
            expected = min(int(np.searchsorted(cum, x, side="right")), hi - 1)
            assert _weighted_position(cum, table, x, lo, hi) == expected


def _reference_edges(source) -> tuple[np.ndarray, np.ndarray]:
    """The generator written with NumPy alone (searchsorted over the whole weight array),
    the moved self-loops included: what the numba kernel must reproduce."""
    s = source.spec
    n = s.num_nodes
    by_class = np.argsort(source._labels, kind="stable")
    cum = np.cumsum(source._weights()[by_class])
    sizes = np.bincount(source._labels, minlength=s.num_classes)
    class_end = np.cumsum(sizes)
    class_start = class_end - sizes
    src, dst = [], []
    for k, lo in enumerate(range(0, source.num_edges, 1 << 20)):
        m = min(1 << 20, source.num_edges - lo)
        rng = np.random.default_rng([s.seed, 3, k])
        pick, kind, draw = rng.random(m), rng.random(m), rng.random(m)
        pos = np.searchsorted(cum, pick * cum[-1], side="right").clip(max=n - 1)
        c = np.searchsorted(class_end, pos, side="right")
        first, last = np.zeros(m, np.int64), np.full(m, n, np.int64)
        inside = kind < s.homophily + s.local_fraction * (1 - s.homophily)
        first[inside], last[inside] = class_start[c[inside]], class_end[c[inside]]
        local = kind < s.local_fraction
        first[local] += (pos[local] - first[local]) // s.local_size * s.local_size
        last[local] = np.minimum(first[local] + s.local_size, last[local])
        lo_w = np.where(first > 0, cum[first - 1], 0.0)
        b = np.searchsorted(cum, lo_w + draw * (cum[last - 1] - lo_w), side="right").clip(max=n - 1)
        loop = b == pos
        b[loop] = first[loop] + (b[loop] - first[loop] + 1) % (last[loop] - first[loop])
        src.append(by_class[pos])
        dst.append(by_class[b])
    return np.concatenate(src), np.concatenate(dst)


@pytest.mark.parametrize("local_fraction", [0.0, 0.7])
def test_synthetic_edges_equal_the_numpy_reference_whatever_the_chunking(local_fraction):
    source = synthetic_source(None, num_nodes=3000, avg_degree=900, local_fraction=local_fraction,
                              local_size=50)
    assert source.num_edges > 1 << 20  # two RNG blocks
    src, dst = source.load_edges()
    ref_src, ref_dst = _reference_edges(source)
    np.testing.assert_array_equal(src, ref_src)
    np.testing.assert_array_equal(dst, ref_dst)
    assert not np.any(src == dst)
    pieces = list(source.edge_chunks(99_991))
    np.testing.assert_array_equal(np.concatenate([p[0] for p in pieces]), src)


class Interrupted(Exception):
    pass


def _interrupt_at(stage: str, count: int = 2):
    """A progress callback that raises the `count`-th time it hears of `stage`."""
    heard = []

    def notify(name: str, done: int, total: int) -> None:
        if name == stage:
            heard.append(done)
            if len(heard) == count:
                raise Interrupted(stage)
    return notify


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("stage", ["sort edges", "merge buckets"])
def test_external_csc_resumes_after_an_interruption(tmp_path, symmetric, stage):
    rng = np.random.default_rng(5)
    n, e = 500, 20_000
    src, dst = rng.integers(n, size=e), np.where(rng.random(e) < 0.3, 3, rng.integers(n, size=e))
    chunks = lambda: ((src[lo:lo + 997], dst[lo:lo + 997]) for lo in range(0, e, 997))  # noqa: E731
    args = (chunks, n, symmetric, 600, tmp_path / "scratch", tmp_path / "indices.npy")
    with pytest.raises(Interrupted):
        external_csc(*args, expected_edges=e * (1 + symmetric), progress=_interrupt_at(stage, 3))
    assert (tmp_path / "scratch").exists()
    indptr, indices = external_csc(*args, expected_edges=e * (1 + symmetric))
    ref_indptr, ref_indices = csc_from_edges(src, dst, n, symmetric=symmetric)
    np.testing.assert_array_equal(indptr, ref_indptr)
    np.testing.assert_array_equal(indices, ref_indices)
    assert not (tmp_path / "scratch").exists()


@pytest.mark.parametrize("inv_dtype", [np.int64, np.int32])
def test_renumber_to_file_in_chunks_equals_renumber_in_memory(tmp_path, inv_dtype):
    data = random_graph_arrays(num_nodes=400, num_edges=5000)
    indptr, indices = csc_from_edges(*data["edges"], 400, symmetric=True)
    perm = np.random.default_rng(1).permutation(400)
    inv = np.argsort(perm).astype(inv_dtype)
    seen = []
    new_indptr, new_indices = renumber_csc_to_file(indptr, indices, perm, inv, tmp_path / "i.npy", 300,
                                                   lambda done, total: seen.append(done))
    ref_indptr, ref_indices = renumber_csc(indptr, indices, perm, inv)
    np.testing.assert_array_equal(new_indptr, np.concatenate([[0], np.cumsum(np.diff(indptr)[perm])]))
    np.testing.assert_array_equal(new_indptr, ref_indptr)
    np.testing.assert_array_equal(new_indices, ref_indices)
    assert len(seen) > 10


def test_labels_are_held_narrow_and_written_as_int64(tmp_path):
    """preprocess holds labels in the narrowest type of their classes (memory at 10^8 nodes);
    the store's labels.npy stays int64 and equal to the source's."""
    data = random_graph_arrays(num_nodes=300, num_edges=2000)
    labels = data["labels"].astype(np.int64)
    unsplit = np.setdiff1d(np.arange(300), np.concatenate(list(data["splits"].values())))
    labels[unsplit[::3]] = -1
    source = ArraySource(data["features"], data["edges"], labels, data["splits"], name="narrow")
    assert writer._checked_labels(source).dtype == np.int8
    write_store(tmp_path / "s", source)
    stored = np.load(tmp_path / "s" / "labels.npy")
    assert stored.dtype == np.int64
    np.testing.assert_array_equal(stored, labels)


def test_degree_order_counted_in_chunks_equals_bincount(monkeypatch):
    data = random_graph_arrays(num_nodes=400, num_edges=5000)
    indptr, indices = csc_from_edges(*data["edges"], 400)
    monkeypatch.setattr(sampler_order, "COUNT_CHUNK", 77)
    expected = np.argsort(-np.bincount(indices, minlength=400), kind="stable")
    np.testing.assert_array_equal(sampler_order.degree_order(indptr, indices), expected)


STAGES = ["sort edges", "merge buckets", "renumber", "features", "reorder", "page checksums"]


@pytest.mark.parametrize("stage", STAGES)
def test_preprocess_interrupted_in_any_step_resumes_to_the_same_store(tmp_path, monkeypatch, stage):
    """Small chunks make every step take many progress calls (edge buckets, renumber
    chunks, feature windows); the run is stopped in the middle of `stage`, rerun, and
    every file equals that of a run never stopped."""
    monkeypatch.setattr(features, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(topology, "RENUMBER_CHUNK_EDGES", 500)
    monkeypatch.setattr(topology, "CHUNK_EDGES", 700)
    monkeypatch.setattr(topology, "MIN_BUCKET_EDGES", 1000)
    monkeypatch.setattr(reorder, "SYNC_BYTES", 4096)
    data = random_graph_arrays(num_nodes=2000, num_edges=12_000, dim=16)
    source = lambda: ArraySource(**data, symmetric=True)  # noqa: E731
    kwargs = dict(order=node_order("degree"), memory_limit=1, dtype="float16")
    reference = write_store(tmp_path / "reference", source(), **kwargs)
    out = tmp_path / "store"
    with pytest.raises(Interrupted):
        write_store(out, source(), progress=_interrupt_at(stage), **kwargs)
    assert not out.exists() and (tmp_path / ".store.partial").exists()
    write_store(out, source(), **kwargs)
    Store.open(out, verify=True)
    names = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        if name != "manifest.json":
            assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    store = Store.open(out)
    perm = np.asarray(store.perm)
    rows = np.fromfile(out / "features.bin", dtype=np.float16)[:2000 * 16].reshape(2000, 16)
    np.testing.assert_array_equal(rows, data["features"].astype(np.float16)[perm])


def test_resumed_reorder_keeps_its_window_size(tmp_path, monkeypatch):
    """The window size depends on the memory free when the step starts; a resumed run
    must use the one its files were distributed with."""
    monkeypatch.setattr(features, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(reorder, "SYNC_BYTES", 4096)  # progress recorded after every chunk
    data = random_graph_arrays(num_nodes=2000, num_edges=12_000, dim=16)
    source = lambda: ArraySource(**data, symmetric=True)  # noqa: E731
    monkeypatch.setattr(writer, "_window_rows", lambda spare, row_bytes: 300)
    with pytest.raises(Interrupted):
        write_store(tmp_path / "store", source(), order=node_order("degree"),
                    progress=_interrupt_at("features", 3))
    monkeypatch.setattr(writer, "_window_rows", lambda spare, row_bytes: 700)
    out = write_store(tmp_path / "store", source(), order=node_order("degree"))
    perm = np.asarray(Store.open(out, verify=True).perm)
    rows = np.fromfile(out / "features.bin", dtype=np.float32)[:2000 * 16].reshape(2000, 16)
    np.testing.assert_array_equal(rows, data["features"][perm])


# "relations" heard 5 times while the topology is built in the source's order; "renumber"
# after the first pass of its renumbering into the store's order
@pytest.mark.parametrize("stage, count", [("relations", 3), ("renumber", 1), ("features", 2), ("reorder", 2)])
def test_typed_store_in_another_order_interrupted_in_any_step_resumes_to_the_same_store(
        tmp_path, monkeypatch, stage, count):
    """A heterogeneous store in degree order: stopped in the middle of `stage`, rerun, and
    every file equals that of a run never stopped."""
    monkeypatch.setattr(features, "CHUNK_BYTES", 4096)  # 32 rows of 64 float16
    monkeypatch.setattr(reorder, "SYNC_BYTES", 4096)
    monkeypatch.setattr(writer, "_window_rows", lambda spare, row_bytes: 70)
    source = lambda: ToyHeteroSource(feat_dim=64)  # noqa: E731
    kwargs = dict(order=node_order("degree"), dtype="float16")
    reference = write_store(tmp_path / "reference", source(), **kwargs)
    out = tmp_path / "store"
    with pytest.raises(Interrupted):
        write_store(out, source(), progress=_interrupt_at(stage, count), **kwargs)
    assert not out.exists() and (tmp_path / ".store.partial").exists()
    write_store(out, source(), **kwargs)
    store = Store.open(out, verify=True)
    names = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        if name != "manifest.json":
            assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert store.manifest["order"] == "degree"
    np.testing.assert_array_equal(store.read_features(), source().features.astype(np.float16)[np.asarray(store.perm)[:300]])
