"""gnnssd.NodeLoader, the public mini-batch contract, in memory and ssd mode alike; and
Trainer with a user's model."""
from __future__ import annotations

import typing
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import gnnssd
from gnnssd.core.config import SamplerConfig, config_from_dict
from gnnssd.sampler import Proximity, SeedOrder, Shuffled, seed_batches
from gnnssd.sampler.seed_order import SEED_ORDERS, shard
from gnnssd.storage_format import write_store

from tests.conftest import REPO, tiny_degree_store

FANOUTS = [4, 3]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> gnnssd.Store:
    return tiny_degree_store(tmp_path_factory.mktemp("node_loader"))


def _loader(store: gnnssd.Store, features: str, **options) -> gnnssd.NodeLoader:
    options = {"fanouts": FANOUTS, "batch_size": 300, "shuffle": True, "seed": 7, "device": "cpu",
               "memory_budget": "16MiB", "hot_fraction": 0.01, "eval_batch_size": 500, "mega_batch": 3,
               **options}
    return gnnssd.NodeLoader(store, store.train_idx, features=features, **options)


def _assert_edges_of_the_store(store: gnnssd.Store, rows: np.ndarray, block) -> None:
    """Each edge u -> v of `block` (its dgl.NID in the dataset's IDs) is an in-edge of v's
    store row in the store's CSC, from u's store row: the IDs were converted consistently."""
    src, dst = (t.numpy() for t in block.edges())
    src_rows = rows[block.srcdata["_ID"].numpy()[src]]
    dst_rows = rows[block.dstdata["_ID"].numpy()[dst]]
    indptr, indices = np.asarray(store.indptr), np.asarray(store.indices)
    for u, v in zip(src_rows, dst_rows):
        assert u in indices[indptr[v]:indptr[v + 1]], (u, v)


def test_memory_and_ssd_yield_the_same_seed_batches(store: gnnssd.Store) -> None:
    """The same mini-batches in both modes, in the dataset's node IDs (the store is
    renumbered): x and y are the stored rows of those nodes, the blocks' dgl.NID agree."""
    rows = np.asarray(store.inv)  # the original ID's store row
    features = store.features_memmap()
    labels = np.asarray(store.labels)
    seen: dict[str, list[list[np.ndarray]]] = {}
    for mode in ("memory", "ssd"):
        with _loader(store, mode) as loader:
            epochs = []
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                batches = list(loader)
                assert len(batches) == len(loader) == -(-len(store.train_idx) // 300)
                for mb in batches:
                    inputs = mb.input_nodes.numpy()
                    assert mb.x.dtype == torch.float32
                    np.testing.assert_array_equal(mb.x.numpy(), features[rows[inputs]])
                    np.testing.assert_array_equal(mb.y.numpy(), labels[rows[mb.output_nodes.numpy()]])
                    np.testing.assert_array_equal(mb.blocks[-1].dstdata["_ID"].numpy(), mb.output_nodes.numpy())
                    np.testing.assert_array_equal(mb.blocks[0].srcdata["_ID"].numpy(), inputs)
                    assert len(mb.blocks) == len(FANOUTS)
                    for block in mb.blocks:  # every block's edges, in dataset IDs, are the graph's
                        _assert_edges_of_the_store(store, rows, block)
                epochs.append([mb.output_nodes.numpy() for mb in batches])
            seen[mode] = epochs
    perm = np.asarray(store.perm)
    expected = [[perm[b] for b in seed_batches(store.train_store_ids, 300, Shuffled(), 7, epoch)] for epoch in (0, 1)]
    for mode, epochs in seen.items():
        for got, want in zip(epochs, expected):
            assert len(got) == len(want), mode
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
    assert not np.array_equal(seen["ssd"][0][0], seen["ssd"][1][0])  # a new shuffle per epoch


def test_proximity_seed_order_reaches_every_mode(store: gnnssd.Store) -> None:
    expected = [np.asarray(store.perm)[b] for b in seed_batches(store.train_store_ids, 300, Proximity(600), 7, 1)]
    for mode in ("memory", "ssd"):
        with _loader(store, mode, seed_order="proximity", seed_window=600) as loader:
            loader.set_epoch(1)
            got = [mb.output_nodes.numpy() for mb in loader]
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="seed_order: 'nearby'; expected one of"):
        _loader(store, "memory", seed_order="nearby")


class _Reversed(SeedOrder):
    """A user's own seed order: the seeds backwards."""

    name = "reversed"

    def _order(self, seeds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        return seeds[::-1]


def test_a_users_seed_order_plugs_in(store: gnnssd.Store) -> None:
    """A SeedOrder object is used as given, in every mode, and sharded across ranks like a
    named one; the config's names are the sampler's."""
    expected = np.asarray(store.perm)[np.asarray(store.train_store_ids)[::-1]]
    for mode in ("memory", "ssd"):
        with _loader(store, mode, seed_order=_Reversed()) as loader:
            np.testing.assert_array_equal(np.concatenate([mb.output_nodes.numpy() for mb in loader]), expected)
        with _loader(store, mode, seed_order=_Reversed(), rank=1, world_size=2) as loader:
            np.testing.assert_array_equal(np.concatenate([mb.output_nodes.numpy() for mb in loader]),
                                          shard(expected, 1, 2))
    assert set(typing.get_args(typing.get_type_hints(SamplerConfig)["seed_order"])) == set(SEED_ORDERS)


def test_full_neighbourhoods_agree_between_dgl_and_gnnssd_sampling(store: gnnssd.Store) -> None:
    """With all neighbours (no random draw), DGL's sampler (memory) and gnnssd's planner
    (ssd) must reach the same input nodes for each seed batch."""
    inputs = {}
    for mode in ("memory", "ssd"):
        with _loader(store, mode, fanouts=[-1, -1], batch_size=200, shuffle=False) as loader:
            inputs[mode] = [np.sort(mb.input_nodes.numpy()) for mb in loader]
    assert len(inputs["memory"]) == len(inputs["ssd"])
    for a, b in zip(inputs["memory"], inputs["ssd"]):
        np.testing.assert_array_equal(a, b)


def test_counters_options_and_close(store: gnnssd.Store) -> None:
    loader = _loader(store, "ssd", drop_last=True)
    scratch = loader.source._scratch
    assert scratch is not None and scratch.is_dir()
    assert len(loader) == len(store.train_idx) // 300
    setup = loader.io_stats()
    assert 0 < setup["bytes_read"] < store.feature_bytes  # a hot cache of ~1% of the budget
    list(loader)
    epoch = loader.io_stats()
    assert epoch["requests"] > 0 and loader.io_stats()["bytes_read"] == 0  # since the previous call
    assert {"plan", "read", "gather", "wait"} <= set(loader.stage_times())
    test = loader.with_seeds(store.test_idx, fanouts=[-1, -1], batch_size=500)
    assert len(test) == -(-len(store.test_idx) // 500)
    assert sorted(np.concatenate([mb.output_nodes.numpy() for mb in test])) == sorted(store.test_idx)
    test.close()  # a view: releases nothing
    assert len(list(loader)) == len(loader)
    loader.close()
    loader.close()
    assert not scratch.exists()


def test_bad_options_are_refused(store: gnnssd.Store) -> None:
    with pytest.raises(ValueError, match="features: 'disk'; expected one of"):
        _loader(store, "disk")
    with pytest.raises(ValueError, match="memory_budget: .* is too small"):
        _loader(store, "ssd", memory_budget="64KiB")


class TinyGCN(nn.Module):
    """A model gnnssd does not ship: two dgl.nn GraphConv layers."""

    def __init__(self, in_feats: int, classes: int):
        super().__init__()
        import dgl.nn

        self.layers = nn.ModuleList([dgl.nn.GraphConv(in_feats, 32, activation=torch.relu,
                                                      allow_zero_in_degree=True),
                                     dgl.nn.GraphConv(32, classes, allow_zero_in_degree=True)])

    def forward(self, blocks, x):
        for layer, block in zip(self.layers, blocks):
            x = layer(block, x)
        return x


def test_trainer_trains_a_users_model(store: gnnssd.Store, tmp_path: Path) -> None:
    config = config_from_dict({"store": str(store.path), "run_dir": str(tmp_path / "run"), "features": "ssd",
                               "sampler": {"fanouts": FANOUTS, "batch_size": 300},
                               "train": {"epochs": 3, "lr": 0.02, "progress": False},
                               "ssd": {"memory_budget": "24MiB"}})
    model = TinyGCN(store.feat_dim, store.num_classes)
    trainer = gnnssd.Trainer(config, model=model)
    try:
        assert trainer.model is model
        history = trainer.fit()
        assert history[-1]["train_loss"] < history[0]["train_loss"]
        assert trainer.evaluate("test")["accuracy"] > 2 / store.num_classes
    finally:
        trainer.close()


def test_the_custom_model_example_runs_in_ssd_mode(store: gnnssd.Store) -> None:
    """examples/custom_model.py: its compiled layer compiles (no fallback) and learns."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("custom_model", REPO / "examples" / "custom_model.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="gnnssd.compile")
        best = example.main(["--store", str(store.path), "--features", "ssd", "--epochs", "3"])
    assert best["test"] > 2 / store.num_classes and best["io_bytes_read"] > 0


def test_the_dgl_style_example_validates_mid_epoch_and_learns(store: gnnssd.Store) -> None:
    """examples/node_classification.py: DGL's loop, validation every 3 steps inside the epoch."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("node_classification", REPO / "examples" / "node_classification.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    best = example.train(str(store.path), "ssd", "16MiB", epochs=3, eval_every=3, batch_size=256, lr=0.01)
    assert best["step"] % 3 == 0 and best["test"] > 2 / store.num_classes


def test_memory_mode_larger_than_the_available_memory_is_refused_at_once(tmp_path, monkeypatch):
    """Features (or the topology) that do not fit in RAM: a ConfigError naming the parts
    and suggesting features: ssd, before anything is loaded."""
    import psutil
    from gnnssd.datasets import ArraySource
    from gnnssd.storage_format import Store

    from gnnssd import NodeLoader
    from gnnssd.core.config import ConfigError
    from tests.conftest import random_graph_arrays

    store = Store.open(write_store(tmp_path / "s", ArraySource(**random_graph_arrays(num_nodes=500, dim=64))))
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=8 << 10))
    for features in ("memory", "mmap", "per-row"):
        with pytest.raises(ConfigError, match=rf"features: {features} needs about .* of RAM for the store "
                           rf".*topology as int64 .*available\. Use `features: ssd` with an `ssd.memory_budget`"):
            NodeLoader(store, store.train_idx, fanouts=[5], batch_size=64, features=features)
    with pytest.raises(ConfigError, match="features as float32 125 KiB"):
        NodeLoader(store, store.train_idx, fanouts=[5], batch_size=64, features="memory")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real)
    with NodeLoader(store, store.train_idx, fanouts=[5], batch_size=64, features="ssd",
                    memory_budget="16MiB") as loader:
        assert len(next(iter(loader)).x) > 0
