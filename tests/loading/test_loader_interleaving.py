"""Views and iterators of one ssd loader interleaved (evaluation in the middle of a training
epoch, two live iterators): every mini-batch's x is the stored rows of its input nodes."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gnnssd
from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store

ORDERS = ("original", "degree")


@pytest.fixture(scope="module", params=ORDERS)
def store(request, tmp_path_factory: pytest.TempPathFactory) -> gnnssd.Store:
    """20k nodes x 64 float32: 5 MiB of features, more than the budgets below hold."""
    source = synthetic_source(num_nodes=20_000, feat_dim=64, num_classes=4, avg_degree=8, train_fraction=0.1)
    path = write_store(tmp_path_factory.mktemp("interleave") / request.param, source,
                       order=node_order(request.param))
    try:
        os.close(os.open(Path(path) / "features.bin", os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("the test directory refuses O_DIRECT (tmpfs?)")
    return gnnssd.Store.open(path)


def user_ids(store: gnnssd.Store, store_ids) -> np.ndarray:
    """The dataset's own IDs of store rows `store_ids` (perm[store_id] = original ID)."""
    return np.asarray(store.perm)[np.asarray(store_ids)]


def stored_rows(store: gnnssd.Store, nodes) -> np.ndarray:
    """The rows of `nodes` (the dataset's node IDs) read from features.bin by a memmap."""
    return store.features_memmap()[np.asarray(store.inv)[np.asarray(nodes)]]


def _loader(store: gnnssd.Store, budget: str, batch_size: int = 100) -> gnnssd.NodeLoader:
    return gnnssd.NodeLoader(store, user_ids(store, store.train_idx), fanouts=[5, 5], batch_size=batch_size,
                             features="ssd", memory_budget=budget, hot_fraction=0.2, mega_batch=4,
                             block_budget=0, shuffle=True, seed=1, device="cpu", eval_batch_size=batch_size)


def _check(store: gnnssd.Store, batch) -> int:
    np.testing.assert_array_equal(batch.x.numpy(), stored_rows(store, batch.input_nodes.numpy()))
    return 1


# 14.5 MiB: buffers of about 4,600 rows beside 12 MiB of queues; the 1,000-seed
# mini-batches reach more cold rows than a buffer holds, so they are read in pieces.
BUDGETS = [("16MiB", 100), ("14.5MiB", 100), ("14.5MiB", 1000)]


@pytest.mark.parametrize("budget,batch_size", BUDGETS)
def test_evaluation_in_the_middle_of_an_epoch(store: gnnssd.Store, budget: str, batch_size: int) -> None:
    with _loader(store, budget, batch_size) as loader:
        valid = loader.with_seeds(user_ids(store, store.valid_idx), fanouts=[-1, -1], batch_size=batch_size)
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen = 0
            for step, batch in enumerate(loader):
                seen += _check(store, batch)
                if step % 2 == 0:
                    assert sum(_check(store, b) for b in valid) == len(valid)
            assert seen == len(loader)
        if batch_size == 1000:  # the budget forces pieces: a mini-batch's cold rows overflow a buffer
            backend = loader.backend
            cold = np.setdiff1d(np.asarray(store.inv)[batch.input_nodes.numpy()], backend.hot.members.rows)
            assert len(cold) > backend.budget.buffer_rows


@pytest.mark.parametrize("budget,batch_size", BUDGETS)
def test_two_live_iterators_of_one_loader(store: gnnssd.Store, budget: str, batch_size: int) -> None:
    """Alternating two iterators gives each the mini-batches it gives alone."""
    with _loader(store, budget, batch_size) as loader:
        alone = [b.input_nodes.numpy() for b in loader]
        loader.set_epoch(0)  # each iteration is the next epoch: both replay the first
        first = iter(loader)
        loader.set_epoch(0)
        second = iter(loader)
        for expected in alone:
            for it in (first, second):
                batch = next(it)
                _check(store, batch)
                np.testing.assert_array_equal(batch.input_nodes.numpy(), expected)
        assert next(first, None) is None and next(second, None) is None


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(["train", "valid", "test", "restart"]), min_size=1, max_size=30))
def test_random_interleavings_of_views(store: gnnssd.Store, steps: list[str]) -> None:
    """Any sequence of next() calls on training, validation and test iterators (and fresh
    training iterators) hands out the stored rows every time."""
    with _loader(store, "14.5MiB", 300) as loader:
        views = {"train": loader,
                 "valid": loader.with_seeds(user_ids(store, store.valid_idx), fanouts=[-1, 3], batch_size=200),
                 "test": loader.with_seeds(user_ids(store, store.test_idx), batch_size=500)}
        live = {name: iter(view) for name, view in views.items()}
        for step in steps:
            if step == "restart":
                live["train"] = iter(loader)
                continue
            batch = next(live[step], None)
            if batch is None:
                live[step] = iter(views[step])
            else:
                _check(store, batch)
