"""Epochs as DGL's DataLoader has them: each iteration of a loader is the next epoch (a
fresh shuffle, fresh neighbour draws, fresh negatives), set_epoch pins one (the same epoch
replays the same mini-batches), and the default seed comes from torch's generator."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gnnssd
from gnnssd.datasets import synthetic_source
from gnnssd.storage_format import write_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> gnnssd.Store:
    return gnnssd.Store.open(write_store(tmp_path_factory.mktemp("epochs") / "tiny", synthetic_source("tiny")))


def _loader(store, features: str, **options) -> gnnssd.NodeLoader:
    return gnnssd.NodeLoader(store, store.train_idx, **{"fanouts": [4, 4], "batch_size": 64, "shuffle": True,
                                                        "features": features, "memory_budget": "16MiB",
                                                        "device": "cpu", **options})


def _epoch(loader) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each mini-batch's seeds, input nodes and first block's edges."""
    out = []
    for mb in loader:
        src, dst = mb.blocks[0].edges()
        out.append((mb.output_nodes.numpy().copy(), mb.input_nodes.numpy().copy(),
                    np.stack([mb.input_nodes[src].numpy(), mb.input_nodes[dst].numpy()])))
    return out


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_iterating_again_is_the_next_epoch(store, features) -> None:
    with _loader(store, features, seed=5) as loader:
        first, second = _epoch(loader), _epoch(loader)
        assert loader.epoch == 1
        assert not np.array_equal(first[0][0], second[0][0])  # a fresh shuffle
        loader.set_epoch(1)
        again = _epoch(loader)
        assert [b[0].tolist() for b in again] == [b[0].tolist() for b in second]
        assert [b[0].tolist() for b in _epoch(loader)] != [b[0].tolist() for b in second]  # epoch 2


def test_neighbour_draws_are_fresh_each_epoch(store) -> None:
    with _loader(store, "ssd", seed=5, shuffle=False) as loader:
        first, second = _epoch(loader), _epoch(loader)
    assert [b[0].tolist() for b in first] == [b[0].tolist() for b in second]  # same seeds, in order
    assert any(not np.array_equal(a[2], b[2]) for a, b in zip(first, second))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_set_epoch_replays_an_epoch(store, features) -> None:
    with _loader(store, features, seed=9) as loader:
        loader.set_epoch(3)
        a = _epoch(loader)
        _epoch(loader)
        loader.set_epoch(3)
        b = _epoch(loader)
    if features == "ssd":  # counter-based draws: exact
        assert _same(a, b)
    else:  # DGL's draws repeat only on one thread; the order always
        assert [x[0].tolist() for x in a] == [x[0].tolist() for x in b]


def test_default_seed_follows_torch_manual_seed(store) -> None:
    def seeds_of_first_epoch(torch_seed: int) -> list[list[int]]:
        torch.manual_seed(torch_seed)
        with _loader(store, "memory") as loader:
            return [mb.output_nodes.tolist() for mb in loader]

    assert seeds_of_first_epoch(1) == seeds_of_first_epoch(1)
    assert seeds_of_first_epoch(1) != seeds_of_first_epoch(2)


def test_edge_loader_draws_fresh_negatives_each_epoch(store) -> None:
    indptr = np.asarray(store.indptr)
    dst = np.repeat(np.arange(store.num_nodes), np.diff(indptr))[:200]
    edges = (np.asarray(store.indices[:200], np.int64), dst)  # a store in the original order
    with gnnssd.EdgeLoader(store, edges, fanouts=[2], batch_size=50, seed=3, device="cpu") as loader:
        first = [mb.output_nodes.tolist() for mb in loader]
        second = [mb.output_nodes.tolist() for mb in loader]
        loader.set_epoch(0)
        again = [mb.output_nodes.tolist() for mb in loader]
    assert first != second and first == again
