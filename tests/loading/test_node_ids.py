"""The dataset's own node IDs round-trip through a renumbered store (`--order degree`):
NodeLoader and EdgeLoader take and give them, `Trainer.predict` and `embed` index by them,
checked against the dataset's arrays and against layer-wise inference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gnnssd
from gnnssd.core.config import config_from_dict
from gnnssd.datasets import ArraySource
from gnnssd.cli.layerwise_commands import embed, predict_layerwise
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store

from tests.conftest import random_graph_arrays


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    """A graph given in the dataset's IDs, stored hottest-first (store IDs differ)."""
    arrays = random_graph_arrays(num_nodes=400, num_edges=3000, dim=16)
    out = tmp_path_factory.mktemp("ids")
    nodes = write_store(out / "nodes", ArraySource(**arrays), order=node_order("degree"))
    links = write_store(out / "links", ArraySource(**arrays, symmetric=True), order=node_order("degree"),
                        edge_split=(0.8, 0.1, 0.1), split_seed=2, eval_negatives=20)
    store = gnnssd.Store.open(nodes)
    assert not np.array_equal(np.asarray(store.perm), np.arange(store.num_nodes))
    return arrays, store, gnnssd.Store.open(links)


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_node_loader_speaks_the_datasets_ids(dataset, features) -> None:
    arrays, store, _ = dataset
    train = arrays["splits"]["train"]
    np.testing.assert_array_equal(np.sort(store.train_idx), np.sort(train))
    with gnnssd.NodeLoader(store, train, fanouts=[3, 3], batch_size=32, features=features, device="cpu",
                           memory_budget="16MiB") as loader:
        outputs = []
        for mb in loader:
            np.testing.assert_array_equal(mb.x.numpy(), arrays["features"][mb.input_nodes.numpy()])
            np.testing.assert_array_equal(mb.y.numpy(), arrays["labels"][mb.output_nodes.numpy()])
            outputs.append(mb.output_nodes.numpy())
    np.testing.assert_array_equal(np.sort(np.concatenate(outputs)), np.sort(train))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_edge_loader_speaks_the_datasets_ids(dataset, features) -> None:
    arrays, _, links = dataset
    given = {(u, v) for u, v in zip(*(np.asarray(e).tolist() for e in arrays["edges"]))}
    train = np.asarray(links.link_edges("train"))
    assert all((u, v) in given or (v, u) in given for u, v in train.tolist())
    with gnnssd.EdgeLoader(links, train, fanouts=[3, 3], batch_size=64, features=features, device="cpu",
                           memory_budget="16MiB", shuffle=False) as loader:
        for k, batch in enumerate(loader):
            out = batch.output_nodes.numpy()
            np.testing.assert_array_equal(out[batch.pos.numpy()], train[64 * k: 64 * (k + 1)])
            np.testing.assert_array_equal(batch.x.numpy(), arrays["features"][batch.input_nodes.numpy()])


def _config(store, run_dir, **extra):
    return config_from_dict({"store": str(store.path), "run_dir": str(run_dir), "seed": 0,
                             "model": {"name": "sage", "hidden": 16, "dropout": 0.0},
                             "sampler": {"fanouts": [4, 4], "batch_size": 64},
                             "train": {"epochs": 2, "lr": 0.01, "progress": False}, **extra})


def test_predict_is_indexed_by_the_datasets_ids(dataset, tmp_path) -> None:
    """The loader path (Trainer.predict) and layer-wise inference agree node by node, and
    the test accuracy computed from predict and the dataset's labels is evaluate's."""
    arrays, store, _ = dataset
    config = _config(store, tmp_path / "run")
    trainer = gnnssd.Trainer(config)
    try:
        trainer.fit()
        predicted = trainer.predict()
        test = arrays["splits"]["test"]
        np.testing.assert_array_equal(trainer.predict(test), predicted[test])
        accuracy = trainer.evaluate("test")["accuracy"]
    finally:
        trainer.close()
    np.testing.assert_array_equal(predict_layerwise(config), predicted)
    assert accuracy == pytest.approx(np.mean(predicted[test] == arrays["labels"][test]))


def test_embeddings_are_indexed_by_the_datasets_ids(dataset, tmp_path) -> None:
    """A link run's evaluation embeddings (through the EdgeLoader's source) equal `embed`'s
    layer-wise ones row for row."""
    _, _, links = dataset
    config = _config(links, tmp_path / "run", task="link", link={"negatives": 1, "eval_negatives": 20})
    trainer = gnnssd.Trainer(config)
    try:
        trainer.fit()
        nodes = np.arange(links.num_nodes)
        loader_path = trainer.embeddings(nodes).numpy()
    finally:
        trainer.close()
    embed(config, tmp_path / "emb.npy")
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), loader_path, atol=1e-5)


def test_store_graph_is_the_datasets_graph(dataset) -> None:
    """store.graph(): a DGLGraph of the dataset's edges in its own IDs, usable by DGL's sampler."""
    import dgl

    arrays, store, _ = dataset
    graph = store.graph()
    assert graph.idtype == torch.int64 and graph.num_nodes() == store.num_nodes
    src, dst = (np.asarray(e) for e in arrays["edges"])
    given = {(u, v) for u, v in zip(src.tolist(), dst.tolist()) if u != v}
    got = set(zip(*(t.tolist() for t in graph.edges())))
    assert given <= got and all(u == v for u, v in got - given)
    sampled = dgl.dataloading.NeighborSampler([2]).sample(graph, torch.tensor([0, 1]))
    assert len(sampled[2]) == 1
