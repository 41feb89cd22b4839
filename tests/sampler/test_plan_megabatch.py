"""Mega-batch plans: exact feature reconstruction (in memory and through real reads),
determinism, save/load, background worker, locality knob."""
import time
import tracemalloc

import numpy as np
import pytest

from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.sampler.graphs import random_csc
from gnnssd.pipeline.hot_cache import HotCache
from gnnssd.pipeline import FeatureFile, MegaBatchBuffers
from gnnssd.sampler.plan import PlanConfig, Planner, plan_bytes
from gnnssd.sampler.seed_order import Proximity, Sharded, Shuffled, seed_batches, shard
from gnnssd.sampler.readplan import CostModel, pages_plan, windows
from gnnssd.pipeline.repack import delete, overlap, repack, repacked_windows
from gnnssd.pipeline.worker import PlanWorker
from tests.sampler.plan_files import load_plan, replay, save_plan, saving

N, DIM = 6000, 24


@pytest.fixture(scope="module")
def graph():
    indptr, indices = random_csc(N, 8, seed=7, communities=20)
    train = np.random.default_rng(3).choice(N, 2000, replace=False)
    hot = np.argsort(-np.bincount(indices, minlength=N))[:300]
    feats = np.random.default_rng(4).standard_normal((N, DIM)).astype(np.float32)
    return indptr, indices, train, hot, feats


def _plans(graph, epochs, mega_batch=4, proximity=False):
    """The plans of the training nodes' epochs in batches of 128, in training order (with
    `proximity`, a mega-batch's seeds are one run of nearby IDs)."""
    indptr, indices, train, hot, _ = graph
    planner = Planner(indptr, indices, PlanConfig(fanouts=(5, 4), mega_batch=mega_batch, seed=21), hot_rows=hot)
    order = Proximity(128 * mega_batch) if proximity else Shuffled()
    for epoch in epochs:
        yield from planner.plan_batches(seed_batches(train, 128, order, 21, epoch), epoch)


def _loader(io, path, feats, hot, capacity, model, staging_bytes=32 << 20):
    """The ssd loader's parts: features file, hot cache in front of it, mega-batch buffers."""
    source = FeatureFile(io, path, feats.shape[1], feats.dtype, model, staging_bytes)
    return MegaBatchBuffers(HotCache(source, hot, len(feats)), capacity)


def _features_file(tmp_path, feats):
    path = tmp_path / "features.bin"
    raw = feats.tobytes()
    path.write_bytes(raw + bytes(-len(raw) % 4096))
    return path


@pytest.mark.parametrize("locality", [False, True])
def test_gather_reconstructs_inputs_in_memory(graph, locality):
    feats, hot = graph[4], np.sort(graph[3])
    prev_buffer = None
    plans = list(_plans(graph, [0, 1], proximity=locality))
    assert sum(p.stats["carried_rows"] for p in plans) > 0
    for p in plans:
        buffer = feats[p.read_rows]
        if len(p.carry_src):
            buffer = np.concatenate([buffer, prev_buffer[p.carry_src]])
        assert np.array_equal(buffer, feats[p.rows])
        table = np.concatenate([feats[hot], buffer])  # [hot cache | mega-batch buffer]
        for m, g in zip(p.minibatches, p.gather):
            assert np.array_equal(table[g], feats[m.input_nodes])
        prev_buffer = buffer
        s = p.stats
        assert s["unique_rows"] == len(np.unique(np.concatenate([m.input_nodes for m in p.minibatches])))
        assert s["cold_unique_rows"] == s["read_rows"] + s["carried_rows"] == len(p.rows)


def test_epoch_covers_training_nodes_once(graph):
    train = graph[2]
    for order in (Shuffled(), Proximity(512)):
        b0, b1 = seed_batches(train, 128, order, 1, 0), seed_batches(train, 128, order, 1, 1)
        assert np.array_equal(np.sort(np.concatenate(b0)), np.sort(train))
        assert not np.array_equal(np.concatenate(b0), np.concatenate(b1))  # fresh every epoch
    # the locality knob makes a mega-batch's seeds a contiguous run of the sorted training nodes
    first = np.sort(np.concatenate(seed_batches(train, 128, Proximity(512), 1, 0)[:4]))
    ranks = np.searchsorted(np.sort(train), first)
    assert np.count_nonzero(np.diff(ranks) != 1) <= 1  # one wrap-around at most


def test_proximity_seed_order_draws_batches_from_runs_of_nearby_seeds():
    seeds = np.random.default_rng(5).choice(100_000, 12_800, replace=False)
    window, batch = 1280, 320  # every run is full: four mini-batches per run
    epochs = [seed_batches(seeds, batch, Proximity(window), 3, epoch) for epoch in (0, 1)]
    assert epochs[0][0].tolist() == seed_batches(seeds, batch, Proximity(window), 3, 0)[0].tolist()  # seeded
    for batches in epochs:
        order = np.concatenate(batches)
        assert np.array_equal(np.sort(order), np.sort(seeds))  # every seed once per epoch
        ranks = np.searchsorted(np.sort(seeds), order)
        for start in range(0, len(order), window):  # a run: consecutive sorted seeds (mod n)
            run = np.sort(ranks[start : start + window])
            assert np.count_nonzero(np.diff(run) != 1) <= 1  # at most one wrap past the end
            assert run[-1] - run[0] in (window - 1, len(seeds) - 1)
        inside = np.sort(ranks[:window])
        assert not np.array_equal(ranks[:window], inside)  # shuffled within the run
    assert not np.array_equal(np.concatenate(epochs[0]), np.concatenate(epochs[1]))  # fresh every epoch
    # uniform shuffle: a mini-batch spans nearly all seeds; proximity: one run
    spread = np.ptp(np.searchsorted(np.sort(seeds), seed_batches(seeds, batch, Shuffled(), 3, 0)[0]))
    assert spread > 5 * window
    # ranks shard the proximity order as they shard a random one
    whole = np.concatenate(seed_batches(seeds, batch, Proximity(window), 3, 1))
    for rank in (0, 1):
        mine = np.concatenate(seed_batches(seeds, batch, Sharded(Proximity(window), rank, 2), 3, 1))
        assert np.array_equal(mine, shard(whole, rank, 2))


def test_spilled_plan_restores_whole(graph, tmp_path):
    plan = next(_plans(graph, [2]))
    stub = plan.spill(tmp_path / "p.spill")
    assert stub.minibatches == [] and stub.gather == [] and np.array_equal(stub.read_rows, plan.read_rows)
    stub.read = pages_plan(stub.read_rows, DIM * 4, CostModel.default())  # set while spilled
    whole = stub.restore()
    plan.read = stub.read
    assert whole.equals(plan) and whole.spill_path == ""
    assert not (tmp_path / "p.spill").exists()


def test_a_spilled_plan_is_mapped_back_not_copied(graph, tmp_path):
    """The restore allocates none of the file's bytes (f.read() then a bytearray once held
    two copies of a plan of up to a quarter of the plans' share of the budget; one read
    into fresh memory, one copy): its arrays are views of the file's private mapping."""
    stub = next(_plans(graph, [2])).spill(tmp_path / "p.spill")
    size = (tmp_path / "p.spill").stat().st_size
    tracemalloc.start()
    try:
        stub.restore()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * size


def test_a_restored_plan_outlives_its_file_and_its_arrays_are_its_own(graph, tmp_path):
    """The file is deleted on restore while the arrays map it; writing into them (a copy on
    write) changes neither the file nor another restore of it."""
    plan = next(_plans(graph, [2]))
    kept = plan.spill(tmp_path / "kept.spill")
    first = kept.restore(keep_file=True)
    first.gather[0][:] = -1
    first.minibatches[0].nodes[:] = -1
    assert plan.equals(kept.restore(keep_file=True))
    whole = plan.spill(tmp_path / "p.spill").restore()
    assert not (tmp_path / "p.spill").exists()
    assert whole.equals(plan)


def test_deterministic_and_save_load(graph, tmp_path):
    a = list(_plans(graph, [3]))
    b = list(_plans(graph, [3]))
    assert all(x.equals(y) for x, y in zip(a, b))
    c = list(_plans(graph, [4]))
    assert not a[0].equals(c[0])
    model = CostModel.default()
    for window, *_ in windows(a, DIM * 4, model, disk_budget=1 << 30):
        pass
    save_plan(a[0], tmp_path / "p.npz")
    assert load_plan(tmp_path / "p.npz").equals(a[0])
    assert a[0].read is not None


def test_worker_saves_and_replays(graph, tmp_path):
    direct = list(_plans(graph, [0]))
    with PlanWorker(saving(_plans(graph, [0]), tmp_path), depth=2) as worker:
        background = list(worker)
    assert len(background) == len(direct)
    assert all(x.equals(y) for x, y in zip(direct, background))
    assert all(x.equals(y) for x, y in zip(direct, replay(tmp_path)))


def test_worker_forwards_errors():
    def failing():
        yield 1
        raise RuntimeError("boom")

    with PlanWorker(failing()) as worker, pytest.raises(RuntimeError, match="boom"):
        list(worker)


@pytest.mark.parametrize("backend", ["io_uring", "threads"])  # both engine backends
@pytest.mark.parametrize("disk_budget", [0, 1 << 30])  # pages only; blocks wherever the model likes
# 96 B rows are copied as 8-byte words, 6 B rows byte by byte
@pytest.mark.parametrize("dim, dtype", [(DIM, np.float32), (3, np.float16)])
def test_reads_through_real_file(graph, tmp_path, disk_budget, backend, dim, dtype):
    feats, hot = graph[4][:, :dim].astype(dtype), graph[3]
    row_bytes = feats.shape[1] * feats.itemsize
    path = _features_file(tmp_path, feats)
    io = DirectIO(queue_depth=8, backend=backend)
    # a slow-request model, so that compact blocks win when disk space allows
    model = CostModel(request_s=1e-3, read_bw=1e9, write_bw=1e9, max_request=64 << 10)
    plans = list(_plans(graph, [0, 1], mega_batch=3))
    loader = _loader(io, path, feats, hot, max(len(p.rows) for p in plans), model, staging_bytes=8192)
    strategies = set()
    for window, scan in windows(plans, row_bytes, model, disk_budget):
        repack(io, path, row_bytes, window, scan, tmp_path / "blocks", staging_bytes=8192)
        for p in window:
            strategies.add(p.read.strategy)
            if p.read.strategy == "block":  # the block holds exactly the read rows, in slot order
                data = (tmp_path / "blocks" / p.read.block).read_bytes()
                assert data[: p.num_read * row_bytes] == feats[p.read_rows].tobytes()
                assert len(data) % 4096 == 0 and len(data) - p.num_read * row_bytes < 4096
                assert not any(data[p.num_read * row_bytes:])  # zero padding
            buffer = loader.load(p, tmp_path / "blocks")
            assert np.array_equal(buffer, feats[p.rows])
            for i, m in enumerate(p.minibatches):
                x = loader.gather(p, i, buffer)
                assert x.dtype == np.float32 and np.array_equal(x, feats[m.input_nodes])  # float16 widened
        for p in window:
            delete(p, tmp_path / "blocks")
    if disk_budget == 0:
        assert strategies == {"pages"}
    elif dtype == np.float32:  # (the 36 KiB float16 file is one merged extent: no block pays)
        assert "block" in strategies
    assert not any((tmp_path / "blocks").glob("*.bin"))
    loader.source.close()
    io.shutdown()


def test_piece_blocks_written_with_few_chunks_open_hold_their_rows(graph, tmp_path):
    """Piece plans read disjoint row ranges: the repack closes each block once its last row is
    in, so few write chunks are open at once (`overlap`, checked against a count per row) and
    each is larger; every block still holds exactly its rows, padded to a page."""
    indptr, indices, train, hot, feats = graph
    row_bytes = feats.shape[1] * feats.itemsize
    path = _features_file(tmp_path, feats)
    io = DirectIO(queue_depth=8)
    model = CostModel(request_s=1e-3, read_bw=1e9, write_bw=1e9, max_request=64 << 10)
    planner = Planner(indptr, indices, PlanConfig(fanouts=(5, 4), mega_batch=3, seed=21), hot_rows=hot, max_rows=150)
    plans = list(planner.plan_batches(seed_batches(train, 128, Shuffled(), 21, 0), 0))
    assert sum(bool(p.pieces) for p in plans) > len(plans) // 2
    blocks_seen = 0
    for window, scan in windows(plans, row_bytes, model, 1 << 30):
        blocks = [p for p in window if p.read.strategy == "block"]
        if blocks:
            per_row = np.zeros(N, np.int64)
            for p in blocks:
                per_row[p.read_rows[0]:p.read_rows[-1] + 1] += 1
            assert overlap(blocks) == per_row.max() < len(blocks)
        repack(io, path, row_bytes, window, scan, tmp_path / "blocks", staging_bytes=8192, writer_bytes=64 << 10)
        for p in blocks:
            data = (tmp_path / "blocks" / p.read.block).read_bytes()
            assert data[: p.num_read * row_bytes] == feats[p.read_rows].tobytes()
            assert len(data) % 4096 == 0 and len(data) - p.num_read * row_bytes < 4096
            assert not any(data[p.num_read * row_bytes:])
            blocks_seen += 1
        for p in window:
            delete(p, tmp_path / "blocks")
    assert blocks_seen > 0
    io.shutdown()


def test_worker_bounds_items_alive():
    made, released = [], []

    def source():
        for i in range(6):
            made.append(i)
            yield i

    with PlanWorker(source(), depth=2) as worker:
        for i in worker:
            time.sleep(0.05)  # give the worker time to run ahead if it could
            assert len(made) - len(released) <= 2  # the item held + the one being made
            released.append(i)
    assert released == list(range(6))


def test_worker_counts_only_the_items_it_is_told_to():
    """With `counted`, items it says no to pass without a slot (a mini-batch's pieces before
    its last): the worker runs ahead by `depth` counted items and the uncounted ones between
    them, no further."""
    made, released = [], []

    def source():  # (mini-batch, piece): three pieces a mini-batch, the last one counted
        for i in range(12):
            made.append(i)
            yield i // 3, i % 3

    with PlanWorker(source(), depth=2, counted=lambda item: item[1] == 2) as worker:
        for i, item in enumerate(worker):
            time.sleep(0.05)  # give the worker time to run ahead if it could
            ahead = len(made) - len(released)
            # held and being made: at most 2 counted items, and the pieces before each of them
            assert ahead <= 2 * 3, (item, ahead)
            if i == 0:  # it ran past the first mini-batch's pieces into the next
                assert ahead > 3, ahead
            released.append(item)
    assert released == [(i // 3, i % 3) for i in range(12)]


def test_repacked_windows_pipeline(graph, tmp_path):
    feats, hot = graph[4], graph[3]
    path = _features_file(tmp_path, feats)
    io = DirectIO(queue_depth=8)
    model = CostModel(request_s=1e-3, read_bw=1e9, write_bw=1e9, max_request=64 << 10)
    plans = _plans(graph, [0], mega_batch=2)
    blocks = tmp_path / "blocks"
    budget = 2 << 20
    loader, strategies = None, []
    with PlanWorker(repacked_windows(plans, io, path, DIM * 4, model, budget, blocks), depth=2) as worker:
        for window in worker:
            on_disk = sum(f.stat().st_size for f in blocks.glob("*.bin"))
            assert on_disk <= budget
            for p in window:
                strategies.append(p.read.strategy)
                loader = loader or _loader(io, path, feats, hot, 20000, model)
                buffer = loader.load(p, blocks)
                for i, m in enumerate(p.minibatches):
                    assert np.array_equal(loader.gather(p, i, buffer), feats[m.input_nodes])
            for p in window:
                delete(p, blocks)
    assert "block" in strategies
    loader.source.close()
    io.shutdown()


def test_plans_bounded_by_bytes_hold_the_same_minibatches(graph):
    """With max_bytes, each plan's blocks and gather indices fit it (a single mini-batch
    may pass it), and the mini-batches and every
    input row's features are those of the plans without a bound."""
    indptr, indices, train, hot, feats = graph
    batches = seed_batches(train, 128, Shuffled(), 21, 0)

    def plans(max_bytes):
        planner = Planner(indptr, indices, PlanConfig(fanouts=(5, 4), mega_batch=8, seed=21), hot_rows=hot,
                          max_bytes=max_bytes)
        return list(planner.plan_batches(batches, 0))

    free = plans(None)
    one = plan_bytes(free[0].minibatches[0])
    bounded = plans(2 * one + one // 2)  # about two mini-batches a plan
    assert max(len(p.minibatches) for p in free) == 8
    assert max(len(p.minibatches) for p in bounded) == 2 < len(bounded)
    for p in bounded:
        assert len(p.minibatches) == 1 or sum(map(plan_bytes, p.minibatches)) <= 2 * one + one // 2
    tiny = plans(1)  # less than any mini-batch: one a plan
    assert [len(p.minibatches) for p in tiny] == [1] * len(batches)
    hot_rows = np.sort(hot)
    for variant in (bounded, tiny):
        got = [m for p in variant for m in p.minibatches]
        want = [m for p in free for m in p.minibatches]
        assert len(got) == len(want) == len(batches)
        assert all(a.equals(b) for a, b in zip(got, want))
        for p in variant:  # the gather reconstructs every input row from [hot | buffer]
            table = np.concatenate([feats[hot_rows], feats[p.rows]])
            for m, g in zip(p.minibatches, p.gather):
                assert np.array_equal(table[g], feats[m.input_rows])


def test_the_planner_holds_no_plan_it_passed_on(graph):
    """A plan's blocks are freed once its consumer drops it: the planner keeps only the
    rows the next plan carries from (and pieces are made one at a time)."""
    import weakref

    indptr, indices, train, hot, _ = graph
    for max_rows in (None, 40):  # 40 rows a buffer: every mini-batch in pieces
        planner = Planner(indptr, indices, PlanConfig(fanouts=(5, 4), mega_batch=4, seed=21), hot_rows=hot,
                          max_rows=max_rows)
        made = []
        for plan in planner.plan_batches(seed_batches(train, 128, Shuffled(), 21, 0), 0):
            assert all(ref() is None for ref in made)
            made.append(weakref.ref(plan))
            del plan
        assert len(made) >= 4
