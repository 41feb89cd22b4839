"""`gnnssd.layerwise`: layer-wise inference of a user's model shaped as DGL's and
GraphBolt's examples (`layers`, each called as layer(block, h), ReLU between), in memory
and out of core within a small budget, from a store or an open FeatureSource: equal to
mini-batch inference with every neighbour (DGL's all-neighbour sampler on the store's
graph, the reference)."""
from __future__ import annotations

import dgl
import dgl.nn as dglnn
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnnssd
from gnnssd.datasets import ArraySource
from gnnssd.loading.types import load_features, store_graph
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store

from tests.conftest import random_graph_arrays


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    arrays = random_graph_arrays(num_nodes=600, num_edges=5000, dim=12, classes=5)
    return Store.open(write_store(tmp_path_factory.mktemp("user_layerwise") / "store", ArraySource(**arrays),
                                  order=node_order("degree")))


class ExampleModel(nn.Module):
    """GraphBolt's example's shape: `layers`, ReLU and dropout between them in forward."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.dropout = nn.Dropout(0.5)

    def forward(self, blocks, x):
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            x = layer(block, x)
            if i < len(self.layers) - 1:
                x = self.dropout(F.relu(x))
        return x


def _models(dim: int) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {"sage-mean": ExampleModel([dglnn.SAGEConv(dim, 16, "mean"), dglnn.SAGEConv(16, 16, "mean"),
                                       dglnn.SAGEConv(16, 5, "mean")]),
            "graphconv": ExampleModel([dglnn.GraphConv(dim, 16, norm="right", allow_zero_in_degree=True),
                                       dglnn.GraphConv(16, 5, norm="right", allow_zero_in_degree=True)])}


def _all_neighbour_reference(model: nn.Module, store: Store) -> np.ndarray:
    """Every node's output, row k for the dataset's node k, from DGL's all-neighbour
    mini-batches on the store's graph (store IDs mapped back through perm)."""
    graph, x = store_graph(store), load_features(store)
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(len(model.layers))
    out = None
    model.eval()
    with torch.no_grad():
        for seeds in torch.arange(store.num_nodes).split(128):
            input_nodes, output_nodes, blocks = sampler.sample_blocks(graph, seeds)
            h = model(blocks, x[input_nodes]).numpy()
            out = np.empty((store.num_nodes, h.shape[1]), np.float32) if out is None else out
            out[np.asarray(store.perm)[output_nodes.numpy()]] = h
    return out


@pytest.mark.parametrize("name", ["sage-mean", "graphconv"])
def test_layerwise_of_a_users_model_equals_all_neighbour_minibatches(store, name, tmp_path) -> None:
    model = _models(store.feat_dim)[name].train()
    reference = _all_neighbour_reference(model, store)
    model.train()
    in_memory = gnnssd.layerwise(model, store)
    assert model.training  # the caller's mode restored
    np.testing.assert_allclose(in_memory.numpy(), reference, rtol=1e-4, atol=1e-5)
    out_of_core = gnnssd.layerwise(model, store.path, features="ssd", memory_budget="64KiB",
                                   scratch_dir=tmp_path / "scratch")
    np.testing.assert_allclose(out_of_core.numpy(), reference, rtol=1e-4, atol=1e-5)
    assert not any((tmp_path / "scratch").rglob("*.bin"))  # the layer files are removed
    first = gnnssd.layerwise(model, store, layers=1)  # an embedding: the first layer, its ReLU included
    assert first.shape == (store.num_nodes, 16) and bool((first >= 0).all())


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_layerwise_on_an_open_feature_source(store, features) -> None:
    model = _models(store.feat_dim)["sage-mean"]
    reference = _all_neighbour_reference(model, store)
    with gnnssd.NodeLoader(store, store.train_idx, fanouts=[5, 5, 5], batch_size=64, features=features,
                           memory_budget="16MiB", device="cpu") as loader:
        np.testing.assert_allclose(gnnssd.layerwise(model, loader.source).numpy(), reference, rtol=1e-4, atol=1e-5)
        with pytest.raises(TypeError, match="features and memory_budget are the FeatureSource's"):
            gnnssd.layerwise(model, loader.source, memory_budget="1MiB")


def test_a_model_without_layers_is_refused_by_name(store) -> None:
    with pytest.raises(TypeError, match=r"gnnssd.layerwise: the model \(Linear\) needs `layers`, a non-empty list"):
        gnnssd.layerwise(nn.Linear(3, 3), store)
    with pytest.raises(ValueError, match=r"layers: 4; the model has layers 1..3"):
        gnnssd.layerwise(_models(store.feat_dim)["sage-mean"], store, layers=4)
