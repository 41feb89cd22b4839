"""The bench's baseline loaders give memory mode's inputs; the LRU is an exact LRU."""
from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnssd import NodeLoader
from gnnssd.core.runtime import use_single_thread
from gnnssd.datasets import synthetic_source
from gnnssd.loading.backends.baselines import LRUSlots
from gnnssd.storage_format import Store, write_store

CPU = torch.device("cpu")
FANOUTS = [5, 3]


@pytest.fixture(autouse=True)
def one_thread():
    """DGL's sampler draws repeatably for a dgl.seed only on one thread (with several,
    the draws race); conftest's restore_threads gives later tests their threads back."""
    use_single_thread()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    path = write_store(tmp_path_factory.mktemp("baselines") / "tiny", synthetic_source("tiny"))
    try:
        os.close(os.open(Path(path) / "features.bin", os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("the test directory refuses O_DIRECT (tmpfs?)")
    return Store.open(path)


def _loader(store: Store, features: str, budget: int = 1 << 20) -> NodeLoader:
    return NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=256, features=features,
                      memory_budget=budget, shuffle=True, seed=3, device="cpu")


def _inputs(loader: NodeLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(b.x, b.output_nodes) for b in loader]


def test_mmap_and_per_row_inputs_equal_memory_mode(store: Store) -> None:
    with _loader(store, "memory") as memory:
        reference = _inputs(memory)
    # a cache far smaller than one batch's inputs: hits, misses and evictions all happen
    for name in ("mmap", "per-row"):
        with _loader(store, name, budget=300 * store.row_bytes) as loader:
            got = _inputs(loader)
            assert len(got) == len(reference) == len(loader), name
            for (x, out), (x_ref, out_ref) in zip(got, reference):
                assert torch.equal(out, out_ref), name
                assert x.dtype == torch.float32 and torch.equal(x, x_ref), name
            stages = loader.stage_times()
            assert {"sample", "read", "transfer"} <= set(stages), name
            if name == "per-row":
                stats = loader.io_stats()
                assert stats["cache_hits"] > 0 and stats["cache_misses"] > 0
                assert stats["requests"] == stats["cache_misses"]
                assert stats["bytes_read"] >= stats["requests"] * store.row_bytes


def test_what_the_backends_declare_is_what_the_layers_above_do(store: Store) -> None:
    """The flags on the backend classes decide: a private scratch only for SCRATCH (ssd),
    disk counters in out_of_core, EdgeLoader only over EDGE_BATCHES backends (memory, ssd)."""
    from gnnssd import EdgeLoader, FeatureSource
    from gnnssd.loading import backend_class

    for name in ("memory", "ssd", "mmap", "per-row"):
        backend = backend_class(name)
        with FeatureSource(store, name, device="cpu") as source:
            assert (source._scratch is not None) == backend.SCRATCH == (name == "ssd"), name
            assert source.out_of_core == backend.OUT_OF_CORE == (name != "memory"), name
        assert backend.MEMORY_BUDGET == (name in ("ssd", "per-row")), name
        edges = np.array([[0, 1]])
        if backend.EDGE_BATCHES:
            EdgeLoader(store, edges, fanouts=FANOUTS, batch_size=1, features=name, device="cpu").close()
        else:
            with pytest.raises(ValueError, match=rf"features: '{name}'; expected one of \('memory', 'ssd'\)"):
                EdgeLoader(store, edges, fanouts=FANOUTS, batch_size=1, features=name, device="cpu")
    with pytest.raises(ValueError, match=r"features: 'disk'; expected one of \('memory', 'ssd', 'mmap', 'per-row', 'device'\)"):
        backend_class("disk")


def test_per_row_second_epoch_hits_when_everything_fits(store: Store) -> None:
    with _loader(store, "per-row", budget=store.feature_bytes) as loader:
        first = _inputs(loader)
        assert loader.io_stats()["requests"] > 0
        loader.set_epoch(0)  # the first epoch again: the same inputs
        assert _inputs(loader)[0][0].equal(first[0][0])
        assert loader.io_stats()["requests"] == 0  # all rows cached after the first pass


def _reference_lru(capacity: int, batches: list[np.ndarray]) -> tuple[list[int], list[int]]:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for rows in batches:
        n = 0
        for r in rows.tolist():
            if r in cache:
                cache.move_to_end(r)
                n += 1
            elif capacity:
                cache[r] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
        hits.append(n)
    return hits, list(cache)


@pytest.mark.parametrize("capacity", [0, 1, 7, 64, 500])
def test_lru_matches_ordered_dict(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    # skewed, unique within a batch (as a mini-batch's input nodes are)
    batches = [np.unique(rng.zipf(1.3, size=rng.integers(1, 120)) % 300) for _ in range(40)]
    batches = [rng.permutation(b) for b in batches]
    lru = LRUSlots(capacity, 300)
    hits = []
    for rows in batches:
        slots, hit, _ = lru.access(rows)
        hits.append(int(hit.sum()))
        assert ((slots >= 0) | (capacity == 0)).all()
    ref_hits, ref_keys = _reference_lru(capacity, batches)
    assert hits == ref_hits
    assert lru.keys() == ref_keys
    assert lru.hits == sum(ref_hits) and lru.hits + lru.misses == sum(map(len, batches))
    # every cached row's slot points back at it
    for r in ref_keys:
        assert lru.key[lru.slot_of[r]] == r
