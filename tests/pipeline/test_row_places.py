"""Where each row of a mini-batch's x is (HotCache.places): the device slice of the hottest
rows (ssd.device_budget), the host hot cache, the cold rows read this window. Assembling x
through it, on the host or on a device (CPU tensors standing in for a GPU; a GPU where one
is present), gives what the host gather gave before there were levels, and the store's rows
read with NumPy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnssd import NodeLoader
from gnnssd.core import ConfigError
from gnnssd.datasets import synthetic_source
from gnnssd.pipeline import DirectIO, FeatureFile, HotCache, HotRanking, MegaBatchBuffers
from gnnssd.pipeline.hot_cache import COLD, DEVICE, HOST
from gnnssd.sampler import PlanConfig, Planner, Shuffled, node_order, seed_batches
from gnnssd.storage_format import Store, write_store

FANOUTS = [5, 5]
CPU = torch.device("cpu")
DEVICE_ROWS, HOST_ROWS = 300, 900
LOADER = {"fanouts": FANOUTS, "batch_size": 200, "features": "ssd", "memory_budget": "16MiB", "mega_batch": 4,
          "hot_fraction": 0.3, "block_budget": 0, "seed": 3, "shuffle": True, "device": "cpu"}


@pytest.fixture(scope="module", params=["float32", "float16"])
def store(request, tmp_path_factory) -> Store:
    source = synthetic_source(num_nodes=8000, feat_dim=24, num_classes=4, avg_degree=6, train_fraction=0.3)
    path = tmp_path_factory.mktemp("places") / request.param
    return Store.open(write_store(path, source, order=node_order("degree"), dtype=request.param))


@pytest.fixture
def features(store: Store):
    io = DirectIO(queue_depth=8)
    source = FeatureFile(io, store.features_path, store.feat_dim, store.feat_dtype)
    yield source
    source.close()
    io.shutdown()


def _caches(store: Store, source: FeatureFile) -> tuple[HotCache, HotCache]:
    """The same hot rows twice: all on the host (the cache before levels), and with the
    hottest DEVICE_ROWS of them in a device slice (a CPU tensor here)."""
    ranking = HotRanking(store, FANOUTS)
    rows = ranking.top(DEVICE_ROWS + HOST_ROWS)
    plain = HotCache(source, rows, store.num_nodes)
    sliced = HotCache(source, rows, store.num_nodes, device_rows=ranking.top(DEVICE_ROWS), device=CPU)
    return plain, sliced


def _plans(store: Store, cache: HotCache, max_rows: int | None = None) -> list:
    cfg = PlanConfig(fanouts=tuple(FANOUTS), mega_batch=3, seed=2)
    planner = Planner(store.indptr, store.indices, cfg, cache.members, max_rows=max_rows)
    return list(planner.plan_batches(seed_batches(store.train_store_ids, 128, Shuffled(), 2, 0), 0))


def _assembled(places, cache: HotCache, buffer: np.ndarray, rows: int) -> np.ndarray:
    """x built from `places` with NumPy fancy indexing, independent of the gathers."""
    x = np.full((rows, cache.feat_dim), np.nan, cache.dtype)
    for level, source in ((DEVICE, cache.device_data.numpy()), (HOST, cache.data), (COLD, buffer)):
        at, slots = places.of(level)
        x[at] = source[slots]
    return x


def test_every_row_has_one_place_and_x_built_from_places_is_the_stored_rows(store, features):
    plain, sliced = _caches(store, features)
    stored = store.features_memmap()
    hottest = HotRanking(store, FANOUTS).top(DEVICE_ROWS)
    assert np.array_equal(sliced.members.rows, plain.members.rows) and len(sliced) == len(plain)
    assert len(sliced.device_data) == DEVICE_ROWS and len(sliced.data) == HOST_ROWS
    # today's host gather, the host gather with a slice, the device gather on CPU tensors
    gathers = {name: MegaBatchBuffers(cache, max(len(p.rows) for p in _plans(store, plain)), device=device)
               for name, cache, device in (("plain", plain, None), ("host", sliced, None), ("device", sliced, CPU))}
    served = np.zeros(3, np.int64)
    for plan in _plans(store, plain):
        buffers = {name: g.load(plan) for name, g in gathers.items()}
        for i, mfgs in enumerate(plan.minibatches):
            idx = plan.gather[i]
            places = sliced.places(idx)
            (device_at, _), (host_at, _), (cold_at, _) = (places.of(level) for level in (DEVICE, HOST, COLD))
            at = np.concatenate([device_at, host_at, cold_at])
            assert np.array_equal(np.sort(at), np.arange(len(idx)))  # each row in exactly one level
            # the device slice holds the hottest rows, the host cache the next ones, the rest was read
            assert np.isin(sliced.members.rows[idx[device_at]], hottest).all()
            assert not np.isin(sliced.members.rows[idx[host_at]], hottest).any()
            assert (idx[cold_at] >= len(sliced)).all()
            expected = np.asarray(stored[mfgs.input_rows])
            np.testing.assert_array_equal(_assembled(places, sliced, buffers["host"], len(idx)), expected)
            before = gathers["plain"].gather(plan, i, buffers["plain"])
            np.testing.assert_array_equal(before, expected.astype(np.float32))
            np.testing.assert_array_equal(gathers["host"].gather(plan, i, buffers["host"]), before)
            on_device = gathers["device"].gather(plan, i, buffers["device"])
            assert isinstance(on_device, torch.Tensor) and on_device.dtype == torch.from_numpy(expected).dtype
            np.testing.assert_array_equal(on_device.numpy(), expected)
            served += [len(device_at), len(host_at), len(cold_at)]
    assert (served > 0).all()
    assert gathers["host"].level_rows == gathers["device"].level_rows
    assert list(gathers["host"].level_rows.values()) == served.tolist()


def test_pieces_assembled_on_the_host_and_on_the_device_are_the_stored_rows(store, features):
    """A mini-batch larger than a buffer, read in pieces: each piece fills its positions
    of the x the pieces assemble, on the host and on the device alike."""
    _, sliced = _caches(store, features)
    stored = store.features_memmap()
    max_rows = 150
    plans = _plans(store, sliced, max_rows)
    assert max(p.pieces for p in plans) > 1
    gathers = [MegaBatchBuffers(sliced, max_rows), MegaBatchBuffers(sliced, max_rows, device=CPU)]
    xs: list = [None, None]
    for plan in plans:
        for k, g in enumerate(gathers):
            buffer = g.load(plan)
            if not plan.pieces:
                xs[k] = g.gather(plan, 0, buffer)
                continue
            if plan.piece == 0:
                xs[k] = g.take_x(plan.stats["input_rows"])
            g.gather(plan, 0, buffer, xs[k])
        if not plan.pieces or plan.piece == plan.pieces - 1:
            expected = np.asarray(stored[plan.minibatches[0].input_rows])
            np.testing.assert_array_equal(xs[0], expected.astype(np.float32))
            np.testing.assert_array_equal(xs[1].numpy(), expected)


def test_the_device_gather_reads_the_device_slice_only_where_it_lies(store, features):
    """On a GPU the slice is device memory, which the host cannot view: the device gather's
    host side (its copy of the cold rows into one array) must not touch it. Here a slice that
    NumPy refuses to view (a tensor that requires grad) stands in for one in GPU memory."""
    plain, sliced = _caches(store, features)
    sliced.device_data.requires_grad_(True)
    stored = store.features_memmap()
    plans = _plans(store, plain)
    gather = MegaBatchBuffers(sliced, max(len(p.rows) for p in plans), device=CPU)
    for plan in plans:
        buffer = gather.load(plan)
        for i, mfgs in enumerate(plan.minibatches):
            x = gather.gather(plan, i, buffer)
            np.testing.assert_array_equal(x.detach().numpy(), np.asarray(stored[mfgs.input_rows]))
    assert gather.level_rows["rows_device"] > 0 and gather.level_rows["rows_read"] > 0


def test_layerwise_reads_through_the_levels(store, features):
    """HotCache.read (layer-wise inference's row source) serves both levels and the rest."""
    _, sliced = _caches(store, features)
    ids = np.random.default_rng(0).integers(0, store.feature_rows, 3000)
    np.testing.assert_array_equal(sliced.read(ids), np.asarray(store.features_memmap()[ids]))


def _expected_x(store: Store, batch) -> np.ndarray:
    rows = np.asarray(store.inv)[batch.input_nodes.numpy()]
    return np.asarray(store.features_memmap()[rows]).astype(np.float32)


@pytest.mark.parametrize("gather", ["host", "device"])
def test_loader_with_a_device_slice_gives_the_stored_rows_and_counts_each_level(store, gather):
    budget = store.feature_bytes // 8
    # a host cache of a few percent of these small features, so that some rows are read
    with NodeLoader(store, store.train_idx, **{**LOADER, "hot_fraction": 0.01}, device_budget=budget,
                    gather=gather) as loader:
        loader.set_epoch(1)
        backend = loader.backend
        assert len(backend.hot.device_data) == budget // store.row_bytes
        inputs = 0
        for batch in loader:
            assert batch.x.dtype == torch.float32
            np.testing.assert_array_equal(batch.x.numpy(), _expected_x(store, batch))
            inputs += len(batch.input_nodes)
        stats = loader.io_stats()
    levels = [stats["rows_device"], stats["rows_host_cache"], stats["rows_read"]]
    assert sum(levels) == inputs and min(levels) > 0
    assert stats["rows_device"] > stats["rows_host_cache"] / 2  # the hottest rows serve most per row held


def test_a_device_slice_beyond_the_free_memory_is_refused_naming_the_sizes(store):
    with pytest.raises(ConfigError, match=r"ssd.device_budget: .* of hot rows \(.* rows of \d+ B\) do not fit on "
                                          r"cpu: .* free of .*, less ssd.device_reserve 0.9999 of it leaves 0 B"):
        NodeLoader(store, store.train_idx, **LOADER, device_budget="1MiB", device_reserve=0.9999)


def test_an_int8_store_keeps_its_gather_on_the_host(tmp_path):
    """int8 rows are dequantized on the host: a device gather is refused, a slice on the
    CPU (gathered on the host) gives the dequantized rows as memory mode does."""
    source = synthetic_source(num_nodes=2000, feat_dim=16, num_classes=4, avg_degree=4, train_fraction=0.3)
    store = Store.open(write_store(tmp_path / "s", source, order=node_order("degree"), dtype="int8"))
    with pytest.raises(ConfigError, match=r"ssd.gather: device and ssd.device_budget need a float16 or float32 "
                                          r"store; .* is int8"):
        NodeLoader(store, store.train_idx, **LOADER, gather="device")
    options = {**LOADER, "batch_size": 100}
    with NodeLoader(store, store.train_idx, **options, device_budget="8KiB") as sliced, \
            NodeLoader(store, store.train_idx, **{**options, "features": "memory"}) as memory:
        assert sliced.backend.hot.device_nbytes > 0
        for ours, theirs in zip(sliced, memory):
            np.testing.assert_array_equal(ours.input_nodes, theirs.input_nodes)
            np.testing.assert_array_equal(ours.x, theirs.x)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_the_gpu_reads_the_pinned_host_cache_in_place_and_assembles_the_stored_rows(store, features):
    """On a GPU: the host cache is pinned and read over the bus, the slice is in device
    memory, the cold rows cross once; x on the GPU equals the host gather's."""
    from gnnssd.pipeline.device_gather import host_rows_on

    gpu = torch.device("cuda")
    ranking = HotRanking(store, FANOUTS)
    rows = ranking.top(DEVICE_ROWS + HOST_ROWS)
    plain = HotCache(features, rows, store.num_nodes)
    on_gpu = HotCache(features, rows, store.num_nodes, device_rows=ranking.top(DEVICE_ROWS), device=gpu, pinned=True)
    assert torch.from_numpy(on_gpu.data).is_pinned() and on_gpu.device_data.is_cuda
    view = host_rows_on(on_gpu, gpu)
    assert view.is_cuda and view.data_ptr() == on_gpu.data.ctypes.data  # the host pages themselves
    plans = _plans(store, plain)
    capacity = max(len(p.rows) for p in plans)
    host, device = MegaBatchBuffers(plain, capacity), MegaBatchBuffers(on_gpu, capacity, pinned=True, device=gpu)
    for plan in plans:
        host_buffer, device_buffer = host.load(plan), device.load(plan)
        for i in range(len(plan.minibatches)):
            x = device.gather(plan, i, device_buffer)
            assert x.is_cuda
            np.testing.assert_array_equal(x.float().cpu().numpy(), host.gather(plan, i, host_buffer))
