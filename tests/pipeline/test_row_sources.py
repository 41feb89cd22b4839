"""Every reader and cache of feature rows is a row source, `read(ids)`: the SSD reader,
the hot cache around it, the per-row baseline's LRU around page reads, and layer-wise
inference's float32 inputs over any of them. Each is checked against the rows NumPy reads
from the same file, for IDs in any order, repeated, and none."""
import numpy as np
import pytest

from gnnssd.core.timing import StageTimer
from gnnssd.datasets import synthetic_source
from gnnssd.inference.rows import StoredRows
from gnnssd.loading.backends.baselines import LRUCache, PageReads
from gnnssd.loading.types import IOCounters
from gnnssd.pipeline import DirectIO, FeatureFile, HotCache, RowSource
from gnnssd.storage_format import Store, write_store

NUM_NODES = 3000


@pytest.fixture(scope="module", params=["float32", "float16", "int8"])
def store(request, tmp_path_factory) -> Store:
    source = synthetic_source(num_nodes=NUM_NODES, feat_dim=40, num_classes=4, avg_degree=5)
    return Store.open(write_store(tmp_path_factory.mktemp("rows") / "s", source, dtype=request.param))


@pytest.fixture
def feature_file(store):
    io = DirectIO(queue_depth=8, checksums={store.features_path: store.page_checksums()})
    file = FeatureFile(io, store.features_path, store.feat_dim, store.feat_dtype)
    yield file
    file.close()
    io.shutdown()


def _requests(seed: int) -> list[np.ndarray]:
    """Batches of IDs in any order: clustered, scattered, repeated, one, none."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(np.arange(100, 400)), rng.integers(0, NUM_NODES, 700),
            np.repeat(rng.integers(0, NUM_NODES, 50), 3), np.array([NUM_NODES - 1]),
            np.empty(0, np.int64), rng.integers(0, NUM_NODES, 1200)]


def _check_reads(source: RowSource, store: Store) -> None:
    reference = np.asarray(store.features_memmap())
    assert (source.feat_dim, source.dtype, source.row_bytes) == (store.feat_dim, store.feat_dtype, store.row_bytes)
    for ids in _requests(1):
        got = source.read(ids)
        assert got.shape == (len(ids), store.feat_dim) and got.dtype == store.feat_dtype
        np.testing.assert_array_equal(got, reference[ids])


def test_the_ssd_reader_reads_what_numpy_reads(store, feature_file):
    _check_reads(feature_file, store)
    assert feature_file.bytes_read > 0


def test_the_hot_cache_serves_its_rows_and_asks_its_fallback_for_the_rest(store, feature_file):
    hot = np.random.default_rng(2).choice(NUM_NODES, 500, replace=False)
    cache = HotCache(feature_file, hot, NUM_NODES)
    filled = feature_file.bytes_read
    np.testing.assert_array_equal(cache.read(hot[::-1]), store.features_memmap()[hot[::-1]])
    assert feature_file.bytes_read == filled  # held rows are never read again
    _check_reads(cache, store)
    assert feature_file.bytes_read > filled


@pytest.mark.parametrize("capacity", [0, 64, 5000])
def test_the_lru_cache_around_page_reads_reads_what_numpy_reads(store, capacity):
    io, timer = IOCounters(), StageTimer()
    pages = PageReads(store, io, timer)
    try:
        cache = LRUCache(pages, capacity, NUM_NODES, timer)
        _check_reads(cache, store)
        _check_reads(cache, store)  # again, from the cache as far as it holds the rows
        slots = cache.slots
        assert slots.hits + slots.misses == 2 * sum(map(len, _requests(1)))
        assert io.requests == slots.misses  # one page run per missed row
        assert io.useful_bytes == slots.misses * store.row_bytes
        assert (slots.hits > 0) == (capacity > 0)
        assert set(timer.seconds) == {"read", "gather"}
    finally:
        pages.close()


def test_layerwise_inputs_are_float32_rows_of_any_source(store, feature_file):
    as_float32 = np.asarray(store.as_float32(np.asarray(store.features_memmap()), np.arange(NUM_NODES)))
    rows = StoredRows(feature_file, store.as_float32)
    cached = rows.cached(np.arange(0, NUM_NODES, 7), NUM_NODES)
    assert isinstance(cached.source, HotCache) and cached.source.fallback is feature_file
    for source in (rows, cached):
        assert source.dim == store.feat_dim
        for ids in _requests(3):
            np.testing.assert_array_equal(source.read(ids).numpy(), as_float32[ids])
