"""Memory mode samples with gnnssd's counter-based sampler, as ssd mode does: the same
blocks as ssd mode for every seed batch, uniform and LABOR alike, on homogeneous and
typed stores, and the same mini-batches from every fresh loader under a fixed seed
whatever the thread count (DGL's threaded sampler drew different edges; issue 48).
DGL's samplers stay the reference for the draws' distribution (tests/sampler)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import gnnssd
from gnnssd.storage_format import write_store

from tests.conftest import tiny_degree_store
from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> gnnssd.Store:
    return tiny_degree_store(tmp_path_factory.mktemp("memory_sampling"))


def _epoch(store: gnnssd.Store, features: str, method: str = "uniform", epoch: int = 1,
           seeds=None, **options) -> list[list]:
    """Every mini-batch of one epoch as its input nodes and each block's edges in node IDs."""
    with gnnssd.NodeLoader(store, store.train_idx if seeds is None else seeds, fanouts=[4, 3], batch_size=200,
                           shuffle=True, seed=11, features=features, method=method, memory_budget="16MiB",
                           device="cpu", **options) as loader:
        loader.set_epoch(epoch)
        return [_parts(mb) for mb in loader]


def _parts(mb) -> list:
    parts = [_ids(mb.input_nodes), _ids(mb.output_nodes)]
    for block in mb.blocks:
        for etype in block.canonical_etypes:
            src, dst = block.edges(etype=etype)
            src_ids = block.srcnodes[etype[0]].data["_ID"][src].numpy()
            dst_ids = block.dstnodes[etype[2]].data["_ID"][dst].numpy()
            order = np.lexsort((src_ids, dst_ids))
            parts.append((etype, src_ids[order], dst_ids[order]))
    return parts


def _ids(nodes) -> list:
    return sorted((k, v.numpy()) for k, v in nodes.items()) if isinstance(nodes, dict) else [nodes.numpy()]


def _assert_same(a: list[list], b: list[list]) -> None:
    assert len(a) == len(b) and a
    _assert_equal(a, b)


def _assert_equal(a, b) -> None:
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("method", ["uniform", "labor"])
def test_memory_mode_draws_the_blocks_ssd_mode_draws(store, method) -> None:
    _assert_same(_epoch(store, "memory", method), _epoch(store, "ssd", method, hot_fraction=0.01, mega_batch=2))


@pytest.mark.parametrize("method", ["uniform", "labor"])
def test_fresh_memory_loaders_repeat_under_a_fixed_seed_on_any_thread_count(store, method) -> None:
    threads = numba.get_num_threads()
    try:
        runs = []
        for count in (1, numba.config.NUMBA_NUM_THREADS, 1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(count)
            runs.append(_epoch(store, "memory", method))
    finally:
        numba.set_num_threads(threads)
    for run in runs[1:]:
        _assert_same(runs[0], run)
    _assert_same(_epoch(store, "mmap", method), runs[0])  # the baselines sample as memory mode does


def test_a_typed_stores_memory_and_ssd_minibatches_are_the_same_draws(tmp_path) -> None:
    store = gnnssd.Store.open(write_store(tmp_path / "typed", ToyHeteroSource()))
    seeds = {"paper": store.train_idx}
    for method in ("uniform", "labor"):
        _assert_same(_epoch(store, "memory", method, seeds=seeds), _epoch(store, "ssd", method, seeds=seeds))
