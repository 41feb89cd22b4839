"""The hot cache, the one owner of which rows are hot: its rows come from the features
file through the engine (compared with plain preads), the planner consults its membership
and never reads a hot row, and the gather's [hot | buffer] rebuilds every mini-batch."""
import os

import numpy as np
import pytest

from gnnssd.datasets import synthetic_source
from gnnssd.pipeline import DirectIO, FeatureFile, HotCache, HotRanking, MegaBatchBuffers
from gnnssd.sampler import HotRows, PlanConfig, Planner, Shuffled, node_order, seed_batches
from gnnssd.sampler.order import hotness
from gnnssd.sampler.plan import RowUnion
from gnnssd.storage_format import PageChecksumError, Store, StoreError, write_store
from gnnssd.storage_format.schema import GraphSchema, NodeType
from tests.hetero_graph import RELATIONS, ToyHeteroSource

FANOUTS = [5, 5]


def hottest_rows(store: Store, count: int, fanouts: list[int]) -> np.ndarray:
    """The `count` rows sampling with `fanouts` reaches most (sorted): the hot cache's choice."""
    return HotRanking(store, fanouts).top(count)


@pytest.fixture(scope="module", params=["original", "degree"])
def store(request, tmp_path_factory) -> Store:
    source = synthetic_source(num_nodes=5000, feat_dim=24, num_classes=4, avg_degree=6)
    order = request.param if request.param == "original" else node_order(request.param)
    return Store.open(write_store(tmp_path_factory.mktemp("hot") / "s", source, order=order))


def _pread_rows(path, rows: np.ndarray, row_bytes: int) -> np.ndarray:
    fd = os.open(path, os.O_RDONLY)
    try:
        return np.stack([np.frombuffer(os.pread(fd, row_bytes, int(r) * row_bytes), np.uint8)
                         for r in rows])
    finally:
        os.close(fd)


def test_hottest_rows_follow_the_sampling_heat(store):
    rows = hottest_rows(store, 400, FANOUTS)
    if store.manifest["order"] == "degree":  # hot rows first: the front of the file
        np.testing.assert_array_equal(rows, np.arange(400))
    else:
        heat = hotness(store.indptr, store.indices, FANOUTS, np.asarray(store.train_store_ids))
        assert np.all(np.diff(rows) > 0) and heat[rows].min() >= np.sort(heat)[-400]
    assert len(hottest_rows(store, 0, FANOUTS)) == 0


class TwoFeaturedTypes(ToyHeteroSource):
    """The toy graph with authors' feature rows too: the file holds papers, then authors."""

    def __init__(self):
        super().__init__()
        self.schema = GraphSchema((NodeType("paper", 300, True), NodeType("author", 200, True),
                                   NodeType("institution", 20, False)), RELATIONS, "paper")
        self.features = np.random.default_rng(1).standard_normal((500, self.feat_dim)).astype(np.float32)


@pytest.mark.parametrize("source", [ToyHeteroSource, TwoFeaturedTypes])
def test_typed_store_in_degree_order_caches_the_hottest_rows(source, tmp_path):
    """One featured type: degree order put its hottest rows at the front of the file. Two:
    each type's hottest rows lead its own range, so the front is not the hottest: ranked."""
    store = Store.open(write_store(tmp_path / "s", source(), order=node_order("degree")))
    rows = hottest_rows(store, 60, FANOUTS)
    heat = hotness(store.indptr, store.indices, FANOUTS, np.asarray(store.train_store_ids))[:store.feature_rows]
    if store.feature_rows == 300:
        np.testing.assert_array_equal(rows, np.arange(60))
    else:
        np.testing.assert_array_equal(rows, np.sort(np.argsort(-heat, kind="stable")[:60]))
        assert (rows >= 300).any()  # authors among the hottest, past the papers' range


def test_cache_holds_its_rows_as_a_plain_pread_reads_them(store):
    io = DirectIO(queue_depth=8, checksums={store.features_path: store.page_checksums()})
    source = FeatureFile(io, store.features_path, store.feat_dim, store.feat_dtype)
    try:
        rows = hottest_rows(store, 700, FANOUTS)
        cache = HotCache(source, rows[::-1], store.num_nodes)  # any order in, sorted held
        np.testing.assert_array_equal(cache.members.rows, rows)
        assert np.flatnonzero(cache.members.contains(np.arange(cache.members.num_rows))).tolist() == rows.tolist()
        assert len(cache) == 700 and cache.nbytes == 700 * store.row_bytes
        expected = _pread_rows(store.features_path, rows, store.row_bytes)
        np.testing.assert_array_equal(cache.data.view(np.uint8).reshape(700, -1), expected)
    finally:
        source.close()
        io.shutdown()


def test_planner_never_reads_a_hot_row_and_the_gather_rebuilds_batches(store):
    io = DirectIO(queue_depth=8)
    source = FeatureFile(io, store.features_path, store.feat_dim, store.feat_dtype)
    cache = HotCache(source, hottest_rows(store, 600, FANOUTS), store.num_nodes)
    cfg = PlanConfig(fanouts=tuple(FANOUTS), mega_batch=3, seed=2)
    plans = list(Planner(store.indptr, store.indices, cfg, cache.members).plan_batches(
        seed_batches(store.train_store_ids, 128, Shuffled(), 2, 0), 0))
    loader = MegaBatchBuffers(cache, max(len(p.rows) for p in plans))
    features = store.features_memmap()
    try:
        hits = 0
        for plan in plans:
            assert plan.num_hot == len(cache)
            assert not cache.members.contains(plan.rows).any()  # hot rows are never read or carried
            buffer = loader.load(plan)
            for i, mfgs in enumerate(plan.minibatches):
                np.testing.assert_array_equal(loader.gather(plan, i, buffer), features[mfgs.input_nodes])
            hits += plan.stats["hot_hits"]
        assert hits > 0
    finally:
        source.close()
        io.shutdown()


def test_a_corrupt_hot_page_is_refused(tmp_path):
    path = write_store(tmp_path / "s", synthetic_source(num_nodes=3000, feat_dim=32, num_classes=4,
                                                        avg_degree=4), order=node_order("degree"))
    store = Store.open(path)
    with open(store.features_path, "r+b") as f:
        f.seek(5 * store.row_bytes)
        f.write(b"\xff" * 4)
    io = DirectIO(queue_depth=8, checksums={store.features_path: store.page_checksums()})
    source = FeatureFile(io, store.features_path, store.feat_dim, store.feat_dtype)
    try:
        with pytest.raises(StoreError, match="page 0 ") as err:  # the store's error, read by the engine
            HotCache(source, np.arange(100), store.num_nodes)
        assert isinstance(err.value, PageChecksumError) and isinstance(err.value, OSError)
    finally:
        source.close()
        io.shutdown()


def test_bad_hot_rows_are_named():
    with pytest.raises(ValueError, match=r"hot rows must lie in 0\.\.9, got 3\.\.12"):
        HotRows.of(np.array([3, 12]), 10)
    with pytest.raises(ValueError, match="bitset covers 10 rows, the graph has 11"):
        RowUnion(11, HotRows.of(np.array([1]), 10))


@pytest.mark.parametrize("num_rows", [1, 8, 13, 100_003])
def test_hot_rows_are_a_bit_a_row(num_rows):
    """HotRows' membership is a bitset (num_rows / 8 bytes) that answers as np.isin does."""
    rng = np.random.default_rng(num_rows)
    rows = rng.choice(num_rows, max(1, num_rows // 3), replace=False)
    hot = HotRows.of(rows, num_rows)
    assert hot.bits.nbytes == -(-num_rows // 8)
    every = np.arange(num_rows)
    assert np.array_equal(hot.contains(every), np.isin(every, rows))
    probe = rng.integers(0, num_rows, 1000)
    assert np.array_equal(hot.contains(probe), np.isin(probe, rows))
