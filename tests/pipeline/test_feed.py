"""Feeding a consumer: the ssd loader's x in recycled memory (never overwritten while held,
nor while a copy of it is in flight), float16 rows kept as float16 for a consumer that widens
them, and one numba thread count honoured by every stage; each x against the store's rows
read with NumPy."""
from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from gnnssd import NodeLoader
from gnnssd.core import ConfigError
from gnnssd.datasets import synthetic_source
from gnnssd.pipeline import PlanWorker, Recycler
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store

LOADER = {"fanouts": [5, 5], "batch_size": 200, "features": "ssd", "memory_budget": "16MiB", "mega_batch": 4,
          "hot_fraction": 0.3, "block_budget": 0, "seed": 3, "shuffle": True, "device": "cpu"}


@pytest.fixture(scope="module", params=["float32", "float16"])
def store(request, tmp_path_factory):
    """20k nodes x 64 features: several times the budgets below."""
    source = synthetic_source(num_nodes=20_000, feat_dim=64, num_classes=8, avg_degree=10, train_fraction=0.3)
    path = tmp_path_factory.mktemp("feed") / request.param
    return Store.open(write_store(path, source, order=node_order("degree"), dtype=request.param))


def _epoch(store: Store, **options) -> list:
    """Epoch 1's mini-batches, every one held (none let go before the end)."""
    with NodeLoader(store, store.train_idx, **{**LOADER, **options}) as loader:
        loader.set_epoch(1)
        return list(loader)


def _expected_x(store: Store, batch, dtype) -> np.ndarray:
    """The batch's input rows read from the store's file with NumPy (the loader gives the
    dataset's IDs; the file is in store order)."""
    rows = np.asarray(store.inv)[batch.input_nodes.numpy()]
    return np.asarray(store.features_memmap()[rows]).astype(dtype)


@pytest.mark.parametrize("widen_on_device", [False, True])
def test_held_minibatches_keep_their_x_and_float16_stays_float16_when_asked(store, widen_on_device):
    """An epoch's mini-batches all held at once: each x still equals the store's rows at the
    end (the pool never reuses memory the consumer holds); float16 rows come as float16 with
    widen_on_device, else widened to float32 (exactly)."""
    batches = _epoch(store, widen_on_device=widen_on_device)
    half = store.feat_dtype == np.float16
    dtype = np.float16 if half and widen_on_device else np.float32
    assert len(batches) > 4
    for batch in batches:
        assert batch.x.dtype == (torch.float16 if dtype == np.float16 else torch.float32)
        np.testing.assert_array_equal(batch.x.numpy(), _expected_x(store, batch, dtype))


def test_x_memory_is_recycled_once_the_consumer_lets_go(store):
    """Mini-batches taken one at a time and let go: x memory comes from a couple of arrays."""
    with NodeLoader(store, store.train_idx, **LOADER) as loader:
        loader.set_epoch(1)
        pool = loader.backend.x_pool
        for batch in loader:
            np.testing.assert_array_equal(batch.x.numpy(), _expected_x(store, batch, np.float32))
            assert any(np.shares_memory(batch.x.numpy(), raw) for raw in pool._arrays)
        assert len(pool._arrays) <= pool.keep


class Copy:
    """An in-flight copy's event as torch.cuda.Event offers it (query: done yet?); CUDA's
    own is exercised by the device check."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def test_recycler_waits_for_the_copy_of_a_released_x():
    pool = Recycler(keep=2)
    a = pool.take(100, 8, np.float32)
    copy = Copy()
    pool.release_after(a[10:], copy)  # a view: the array it belongs to is meant
    k = next(k for k, raw in enumerate(pool._arrays) if np.shares_memory(raw, a))  # no reference kept
    del a
    b = pool.take(100, 8, np.float32)  # a's copy in flight: other memory (kept second)
    assert not np.shares_memory(b, pool._arrays[k])
    del b
    c = pool.take(100, 8, np.float32)  # b's memory is free; a's still waits
    assert not np.shares_memory(c, pool._arrays[k])
    copy.done = True
    d = pool.take(100, 8, np.float32)  # c held, a's copy done: a's memory again
    assert np.shares_memory(d, pool._arrays[k])
    assert len(pool._arrays) == 2


def test_one_thread_count_reaches_every_stage_and_leaves_the_batches_unchanged(store):
    """ssd.threads = 1 gives the mini-batches of the default count (draws are counter-based),
    and a stage's worker thread runs its kernels on that many threads."""
    default, single = _epoch(store), _epoch(store, threads=1)
    assert len(default) == len(single)
    for a, b in zip(default, single):
        np.testing.assert_array_equal(a.input_nodes.numpy(), b.input_nodes.numpy())
        np.testing.assert_array_equal(a.x.numpy(), b.x.numpy())
    seen = list(PlanWorker((numba.get_num_threads() for _ in range(2)), threads=1))
    assert seen == [1, 1]


def test_more_threads_than_numbas_pool_are_refused(store):
    too_many = numba.config.NUMBA_NUM_THREADS + 1
    with pytest.raises(ConfigError, match=f"ssd.threads: {too_many} threads.*NUMBA_NUM_THREADS"):
        NodeLoader(store, store.train_idx, **{**LOADER, "threads": too_many})


def test_pieces_spilled_without_their_blocks_give_the_stored_rows(store, tmp_path):
    """Mini-batches larger than a buffer, read in pieces with a block budget (their plans
    spilled while a repack window fills; only the last piece of a mini-batch keeps its
    blocks): every x equals the store's rows."""
    options = {**LOADER, "batch_size": 3000, "memory_budget": "20MiB", "block_budget": "8MiB",
               "scratch_dir": tmp_path}
    with NodeLoader(store, store.train_idx, **options) as loader:
        loader.set_epoch(1)
        backend, most_cold = loader.backend, 0
        for batch in loader:
            np.testing.assert_array_equal(batch.x.numpy(), _expected_x(store, batch, np.float32))
            rows = np.asarray(store.inv)[batch.input_nodes.numpy()]
            most_cold = max(most_cold, len(np.setdiff1d(rows, backend.hot.members.rows)))
        assert backend.block_budget > 0  # plans wait for their repack window spilled
        assert most_cold > backend.budget.buffer_rows  # some came in pieces


def test_a_plan_without_minibatches_spills_and_restores(tmp_path):
    """What a spilled piece keeps: rows, reads and its gather index, no blocks."""
    from gnnssd.sampler import MegaBatchPlan

    plan = MegaBatchPlan(epoch=1, index=3, minibatches=[], gather=[np.array([4, 2])],
                         rows=np.array([5, 9, 11]), num_read=3, carry_src=np.empty(0, np.int64), num_hot=2,
                         stats={"minibatches": 0}, piece=1, pieces=3, positions=np.array([1, 2]))
    restored = plan.spill(tmp_path / "p.spill").restore()
    assert restored.equals(plan) and restored.minibatches == [] and not (tmp_path / "p.spill").exists()


def test_the_first_x_array_is_reserved_when_the_loader_opens(store):
    """The first x array exists from the open (its pages faulted in beside the first
    mini-batch's plan and reads, not in its gather), sized for the largest sampled training
    mini-batch; the first mini-batch's x is in it."""
    with NodeLoader(store, store.train_idx, **LOADER) as loader:
        pool = loader.backend.x_pool
        assert len(pool._arrays) == 1
        reserved = [raw.ctypes.data for raw in pool._arrays]  # addresses: a reference would hold them
        loader.set_epoch(1)
        first = next(iter(loader))
        np.testing.assert_array_equal(first.x.numpy(), _expected_x(store, first, np.float32))
        assert first.x.numpy().ctypes.data in reserved
