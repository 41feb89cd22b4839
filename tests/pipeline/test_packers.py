"""Packers (ssd.packers): windows planned and repacked in packer processes give the mini-batches
the trainer's own planner gives, with the store's rows, and every window's scratch goes."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gnnssd import NodeLoader
from gnnssd.core import ConfigError
from gnnssd.datasets import synthetic_source
from gnnssd.pipeline import FIRST_WINDOW, OWN_WINDOW_MOST, PackerPool, window_bounds
from gnnssd.pipeline.packers import WindowWork
from gnnssd.sampler import Fanouts, Strategy, node_order
from gnnssd.storage_format import Store, write_store

OPTIONS = {"fanouts": [5, 5], "batch_size": 200, "eval_fanouts": [5, 5], "eval_batch_size": 200, "features": "ssd",
           "memory_budget": "28MiB",
           "block_budget": "24MiB", "mega_batch": 4, "hot_fraction": 0.05, "seed": 3, "shuffle": True, "device": "cpu"}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    source = synthetic_source(num_nodes=20_000, feat_dim=64, num_classes=8, avg_degree=10, train_fraction=0.3)
    return Store.open(write_store(tmp_path_factory.mktemp("packers") / "store", source, order=node_order("degree")))


def _epoch(store: Store, packers: int, tmp_path, **options) -> tuple[list[tuple[np.ndarray, np.ndarray]],
                                                                     dict[str, int], dict[int, float]]:
    """(input nodes, x) of every mini-batch of epoch 1, the loader's io_stats, and the CPU
    seconds of each packer process's start, by process ID (`options` beside OPTIONS)."""
    with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=packers,
                    scratch_dir=tmp_path / f"scratch{packers}", **{**OPTIONS, **options}) as loader:
        loader.io_stats()  # the set-up's reads
        loader.set_epoch(1)
        batches = [(batch.input_nodes.numpy().copy(), batch.x.numpy().copy()) for batch in loader]
        stats = loader.io_stats()
        assert not loader.backend.block_dir.exists()  # every window's folder is gone
        starts = dict(loader.backend.packer_start_cpu_s)
    return batches, stats, starts


def test_packers_give_the_trainers_minibatches_with_the_stores_rows(store, tmp_path):
    """0 packers (the trainer's threads plan and repack), 1 and 2 packer processes: the same
    input nodes per mini-batch (samples depend on a mini-batch's position only) and x equal to
    the store's rows; with packers, windows after the first are repacked by the packers
    (bytes read by repack scans and from blocks) and the first is read as page extents; each
    packer reports the CPU its start took (bench_feed's packer_start_cpu_s)."""
    features = store.features_memmap()
    reference, _, no_starts = _epoch(store, 0, tmp_path)
    assert no_starts == {}
    assert len(reference) > 8  # several packer windows
    for packers in (1, 2):
        batches, stats, starts = _epoch(store, packers, tmp_path)
        assert len(batches) == len(reference)
        for (nodes, x), (want_nodes, _) in zip(batches, reference):
            np.testing.assert_array_equal(nodes, want_nodes)
            np.testing.assert_array_equal(x, features[store.store_ids(nodes)])
        assert stats["packing_read_bytes"] > 0 and stats["packed_read_bytes"] > 0 and stats["extents_read_bytes"] > 0
        assert stats["bytes_written"] > 0
        # each packer said what its start took (an interpreter and its imports: not nothing)
        assert len(starts) == packers and os.getpid() not in starts and all(s > 0.1 for s in starts.values())


def test_without_a_block_budget_packers_plan_the_page_reads(store, tmp_path):
    """Block budget 0 (a budget where blocks do not pay: 1/2 of `medium`): the packers plan
    the windows after the trainer's own, every one read as page extents, nothing written;
    the mini-batches are the trainer's own planner's, with the store's rows."""
    features = store.features_memmap()
    reference, _, _ = _epoch(store, 0, tmp_path, block_budget=0)
    batches, stats, starts = _epoch(store, 1, tmp_path / "packed", block_budget=0)
    assert len(batches) == len(reference) > OWN_WINDOW_MOST
    for (nodes, x), (want_nodes, _) in zip(batches, reference):
        np.testing.assert_array_equal(nodes, want_nodes)
        np.testing.assert_array_equal(x, features[store.store_ids(nodes)])
    assert len(starts) == 1  # a packer planned
    assert stats["extents_read_bytes"] > 0 and stats.get("packed_read_bytes", 0) == 0 == stats["bytes_written"]


def test_the_packers_outlive_a_stream_and_serve_the_next(store, tmp_path):
    """One loader, one pool: epoch 1 whole, epoch 2 left after a few mini-batches (its
    windows in progress stopped), epoch 3 whole, all from the packer started for epoch 1,
    every x the store's rows, epochs 1 and 3 the trainer's own planner's mini-batches (the
    packers' windows of a new stream are planned with its epoch). Each stream's folder goes
    once its packer has stopped it, the stopped one's too: none is left between streams."""
    features = store.features_memmap()
    with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=0,
                    scratch_dir=tmp_path / "reference", **OPTIONS) as loader:
        reference = {}
        for epoch in (1, 3):
            loader.set_epoch(epoch)
            reference[epoch] = [batch.input_nodes.numpy().copy() for batch in loader]
    with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=1,
                    scratch_dir=tmp_path / "scratch", **OPTIONS) as loader:
        backend = loader.backend
        folder = backend.block_dir
        for epoch in (1, 2, 3):
            loader.set_epoch(epoch)
            nodes = []
            for batch in loader:
                nodes.append(batch.input_nodes.numpy().copy())
                np.testing.assert_array_equal(batch.x.numpy(), features[store.store_ids(nodes[-1])])
                if epoch == 2 and len(nodes) == OWN_WINDOW_MOST + 2:  # the packer's windows under way
                    break
            if epoch != 2:
                assert len(nodes) == len(loader) and all(map(np.array_equal, nodes, reference[epoch]))
            assert len(backend.packer_start_cpu_s) == 1, backend.packer_start_cpu_s  # the same packer
            assert not folder.exists()
        assert backend.own_minibatches < len(loader)


def test_a_bad_packers_value_names_the_key(store, tmp_path):
    with pytest.raises((ConfigError, ValueError), match="ssd.packers"):
        NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=-1,
                   scratch_dir=tmp_path / "scratch", **OPTIONS)


@pytest.mark.parametrize("users, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_workers_wait_passively_in_the_trainer_and_its_packers(users, expected):
    """Importing gnnssd makes numba's OpenMP workers wait without spinning (spinning on the
    cores the packers share took about half of the loader's CPU), in the trainer and in the
    packer processes, which inherit its environment; a user's own OMP_WAIT_POLICY is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if users is not None:
        env["OMP_WAIT_POLICY"] = users
    program = ("import os, subprocess, sys; import gnnssd; print(os.environ.get('OMP_WAIT_POLICY')); "
               "print(subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"OMP_WAIT_POLICY\"))'], "
               "capture_output=True, text=True, check=True).stdout.strip())")
    shown = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True)
    assert shown.stdout.split() == [expected, expected]


@pytest.mark.parametrize("count, full", [(30, 18), (5, 1), (1, 7), (0, 3), (100, 2), (41, 12)])
def test_window_bounds_cover_every_minibatch_once_in_order_with_only_the_first_window_small(count, full):
    """The packers' windows: consecutive, every mini-batch once, the first at most
    FIRST_WINDOW (packed bytes early), every later one full (their scans pay), whatever
    the number of packers."""
    bounds = window_bounds(count, full)
    assert [lo for lo, _ in bounds] == [0, *(hi for _, hi in bounds[:-1])][: len(bounds)]
    assert (bounds[-1][1] if bounds else 0) == count
    sizes = [hi - lo for lo, hi in bounds]
    assert all(1 <= size <= full for size in sizes)
    assert sizes[:1] == [min(full, FIRST_WINDOW, count)][: len(sizes)]
    assert all(size == full for size in sizes[1:-1])


def test_the_trainers_own_window_is_a_few_minibatches_not_a_block_share(store, tmp_path):
    """At a block budget whose half holds many mini-batches' cold rows (a first window sized
    for a block share read them all as page extents), the trainer plans at most
    OWN_WINDOW_MOST mini-batches itself; every mini-batch still comes once, in order, with
    the store's rows."""
    features = store.features_memmap()
    reference, _, _ = _epoch(store, 0, tmp_path)
    with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=1,
                    scratch_dir=tmp_path / "scratch", **OPTIONS) as loader:
        backend = loader.backend
        assert backend.block_budget // 2 // backend._cold_bytes > 2 * OWN_WINDOW_MOST  # a share: many mini-batches
        loader.set_epoch(1)
        batches = [(batch.input_nodes.numpy().copy(), batch.x.numpy().copy()) for batch in loader]
        assert 1 <= backend.own_minibatches <= OWN_WINDOW_MOST
    assert len(batches) == len(reference)
    for (nodes, x), (want_nodes, _) in zip(batches, reference):
        np.testing.assert_array_equal(nodes, want_nodes)
        np.testing.assert_array_equal(x, features[store.store_ids(nodes)])


def test_a_stream_of_a_few_minibatches_is_the_trainers_own(store, tmp_path):
    """At most OWN_WINDOW_MOST mini-batches: no packer starts (its start, scan and writes
    would come after the trainer read them all in place); one more: a packer does. Either
    way every mini-batch has the store's rows."""
    features = store.features_memmap()
    seeds = store.original_ids(np.asarray(store.train_store_ids))
    size = OPTIONS["batch_size"]
    for count in (OWN_WINDOW_MOST, OWN_WINDOW_MOST + 1):
        with NodeLoader(store, seeds[: count * size], packers=1, scratch_dir=tmp_path / f"scratch{count}",
                        **OPTIONS) as loader:
            loader.set_epoch(1)
            seen = 0
            for batch in loader:
                np.testing.assert_array_equal(batch.x.numpy(), features[store.store_ids(batch.input_nodes.numpy())])
                seen += 1
            assert seen == count
            packed = count > OWN_WINDOW_MOST
            assert len(loader.backend.packer_start_cpu_s) == int(packed), count
            assert (loader.backend.own_minibatches < count) == packed, (count, loader.backend.own_minibatches)


def _block_bytes(directory: Path) -> int:
    """The compact blocks' bytes on disk under `directory` now (streams' and windows'
    folders and their files come and go meanwhile: one gone while looked at counts nothing)."""
    total = 0
    for folder, _, names in os.walk(directory):  # a folder gone while walked is skipped
        for name in names:
            if name.startswith("block_") and name.endswith(".bin"):
                try:
                    total += os.stat(os.path.join(folder, name)).st_size
                except FileNotFoundError:
                    pass
    return total


def test_two_packers_windows_choose_blocks_within_the_block_budget(store, tmp_path):
    """With 2 packers each window may hold half the block budget (not a third): they choose
    blocks, and the blocks on disk, watched throughout the epoch of a slow consumer (the
    packers done ahead of it), never pass the budget: a window writes its blocks only once
    given room."""
    features = store.features_memmap()
    with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=2,
                    scratch_dir=tmp_path / "scratch", **{**OPTIONS, "block_budget": "12MiB"}) as loader:
        backend, most, done = loader.backend, 0, threading.Event()

        def watch() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, _block_bytes(backend.block_dir))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            loader.io_stats()
            loader.set_epoch(1)
            count = 0
            for batch in loader:
                np.testing.assert_array_equal(batch.x.numpy(), features[store.store_ids(batch.input_nodes.numpy())])
                count += 1
                time.sleep(0.05)  # a slow consumer: the packers finish their windows ahead of it
            stats = loader.io_stats()
        finally:
            done.set()
            watcher.join()
    assert count == len(loader) and stats["bytes_written"] > 0 and stats["packed_read_bytes"] > 0
    assert 0 < most <= backend.block_budget


def test_a_packer_plans_its_next_window_while_the_one_before_waits_for_room(store, tmp_path):
    """One packer, four windows given out and room for the first two only (no consumer asks
    for more): window 4 is planned (its plans spilled) while window 3, which chose blocks,
    waits for room with none written. A packer that planned a window only once the one
    before was scanned left the trainer waiting on both in turn."""
    with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=1,
                    scratch_dir=tmp_path / "scratch", **{**OPTIONS, "block_budget": "12MiB"}) as loader:
        backend = loader.backend
        batches = loader.seed_batches()
        full = max(1, -(-(backend.block_budget // 2) // backend._cold_bytes))
        bounds = window_bounds(len(batches), full)[:4]
        assert len(bounds) == 4 and bounds[2][1] - bounds[2][0] == full
        folder = tmp_path / "pool"
        pool = PackerPool(backend._packer_spec(), 1, ahead=3, root=folder)
        try:
            # windows 1-4 given out at once, room for 1 and 2
            pool.assign(backend._plan_config(Fanouts.parse(loader.fanouts).array(store.schema)), 1,
                        [(lo, batches[lo:hi], None) for lo, hi in bounds])
            deadline = time.monotonic() + 60
            while not list((folder / "s1" / "w4").glob("*.spill")) and time.monotonic() < deadline:
                time.sleep(0.05)
            planned_ahead = list((folder / "s1" / "w4").glob("*.spill"))
            blocks_waiting = list((folder / "s1" / "w3").glob("block_*"))
            stubs = [window for window, _ in pool.windows()]  # room for the rest as each is asked for
        finally:
            pool.close()
        assert not folder.exists()  # the pool's folder goes with it
    assert any(p.read.strategy is Strategy.BLOCK for p in stubs[2])  # window 2 needed room
    assert planned_ahead and not blocks_waiting
    assert len(stubs) == 4 and all(stubs)  # every window came, in order, once given room


def test_a_planned_window_keeps_its_rows_in_mapped_files_not_the_packers_memory(store, tmp_path):
    """A packer's planned window: its stubs' read rows (views of one read-only mapping of the
    window folder's rows file) equal its spilled plans' rows, its scan's rows (mapped too) are
    the sorted union of its blocks' rows, and the packer's own (traced) memory holds a small
    part of the rows' bytes: a window's memory no longer grows with its size (the stubs held
    their rows, and the scan its union, before: 8 bytes a row and more; measured 239 kB held
    against 27 kB, for 213 kB of rows)."""
    import mmap
    import tracemalloc

    from gnnssd.pipeline.packers import Packer

    with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=1,
                    scratch_dir=tmp_path / "scratch",
                    **{**OPTIONS, "block_budget": "64MiB", "mega_batch": 1}) as loader:
        spec = loader.backend._packer_spec()
        config = loader.backend._plan_config(Fanouts.parse(loader.fanouts).array(store.schema))
        batches = loader.seed_batches()
    packer = Packer(spec)
    try:
        # the process's first plan makes allocations of its own: not measured
        packer.plan(WindowWork(1, 0, 1, 0, batches[:4], None, config, tmp_path / "w0"))
        tracemalloc.start()
        stubs, scan, rows = packer.plan(WindowWork(1, 1, 1, 4, batches[4:20], None, config, tmp_path / "w1"))
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    finally:
        packer.close()
    assert rows.nbytes == 8 * sum(stub.num_read for stub in stubs) > 0
    assert held < rows.nbytes / 4, (held, rows.nbytes)
    blocks = [stub for stub in stubs if stub.read.strategy is Strategy.BLOCK]
    assert blocks and len(scan.rows)  # the window chose blocks: the scan has rows
    for mapped in (rows, scan.rows):  # NumPy's view of a memoryview of the mapping
        assert isinstance(mapped.base, memoryview) and isinstance(mapped.base.obj, mmap.mmap)
    for stub in stubs:
        assert np.shares_memory(stub.read_rows, rows)
        np.testing.assert_array_equal(stub.read_rows, stub.restore(keep_file=True).read_rows)
    np.testing.assert_array_equal(scan.rows, np.unique(np.concatenate([stub.read_rows for stub in blocks])))


def test_with_packers_the_budget_counts_one_scans_rows_a_packer_not_the_windows(store, tmp_path):
    """With packers, a window's rows wait in mapped files: the memory budget counts each
    packer's scan rows as it builds them, at most one per row of the features, so block
    budgets whose windows hold more rows than the features split the memory alike; where
    the trainer's thread repacks (packers 0) the windows' stubs count, and a larger block
    budget takes memory from the hot cache."""
    def split(packers: int, block_budget: str):
        with NodeLoader(store, store.original_ids(np.asarray(store.train_store_ids)), packers=packers,
                        scratch_dir=tmp_path / "scratch", **{**OPTIONS, "block_budget": block_budget}) as loader:
            assert loader.backend.block_budget // 2 // store.row_bytes > store.feature_rows  # windows past the rows
            return loader.backend.budget

    assert split(1, "24MiB") == split(1, "96MiB")
    assert split(0, "96MiB").hot_rows < split(0, "24MiB").hot_rows
