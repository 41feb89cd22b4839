"""A GraphBolt user's loop on a gnnssd loader: seeds as GraphBolt's ItemSet / ItemSetDict,
GraphBolt's and DGL's sampler method names, and the loop body of DGL v2.1.0's GraphBolt
node-classification example (examples/sampling/graphbolt/node_classification.py: its
train, evaluate and layer-wise inference steps read `data.node_features["feat"]`,
`data.labels`, `data.blocks`, `data.seed_nodes`) unchanged."""
from __future__ import annotations

import dgl.graphbolt as gb
import dgl.nn as dglnn
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnnssd
from gnnssd.datasets import synthetic_source
from gnnssd.sampler import node_order, sampling_method
from gnnssd.storage_format import write_store

from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> gnnssd.Store:
    return gnnssd.Store.open(write_store(tmp_path_factory.mktemp("graphbolt_names") / "tiny",
                                         synthetic_source("tiny"), order=node_order("degree")))


def _labels_of(store: gnnssd.Store, ids: np.ndarray) -> np.ndarray:
    return np.asarray(store.labels)[np.asarray(store.inv)[ids]].astype(np.int64)


class SAGE(nn.Module):
    """The example's model shape: `layers` of (block, x) modules, ReLU between them."""

    def __init__(self, in_size: int, hidden: int, out: int):
        super().__init__()
        self.layers = nn.ModuleList([dglnn.SAGEConv(in_size, hidden, "mean"), dglnn.SAGEConv(hidden, out, "mean")])

    def forward(self, blocks, x):
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            x = layer(block, x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_the_examples_loop_body_runs_on_a_gnnssd_loader(store, features) -> None:
    train_ids = np.asarray(store.train_idx)
    train_set = gb.ItemSet((torch.from_numpy(train_ids), torch.from_numpy(_labels_of(store, train_ids))),
                           names=("seed_nodes", "labels"))
    model = SAGE(store.feat_dim, 16, store.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with gnnssd.NodeLoader(store, train_set, fanouts=[5, 5], batch_size=128, shuffle=True, features=features,
                           method="sample_layer_neighbor", memory_budget="16MiB", device="cpu") as dataloader:
        assert dataloader.source.sampling.method == "labor"
        np.testing.assert_array_equal(dataloader.seeds, train_ids)
        for step, data in enumerate(dataloader):  # the example's train() loop body
            x = data.node_features["feat"]
            y = data.labels
            y_hat = model(data.blocks, x)
            loss = F.cross_entropy(y_hat, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            assert x is data.x and y is data.y and data.seed_nodes is data.output_nodes
            np.testing.assert_array_equal(y.numpy(), _labels_of(store, data.seed_nodes.numpy()))
        valid = dataloader.with_seeds(gb.ItemSet(torch.from_numpy(np.asarray(store.valid_idx)), names="seed_nodes"))
        y_hats, ys = [], []
        with torch.no_grad():
            for data in valid:  # evaluate()
                ys.append(data.labels)
                y_hats.append(model(data.blocks, data.node_features["feat"]))
        assert torch.cat(y_hats).shape == (len(store.valid_idx), store.num_classes) and len(torch.cat(ys))
    all_nodes = gb.ItemSet(store.num_nodes, names="seed_nodes")  # the inference's all_nodes_set
    with torch.no_grad(), gnnssd.NodeLoader(store, all_nodes, fanouts=[-1], batch_size=512, features=features,
                                            memory_budget="16MiB", device="cpu") as infer:
        for data in infer:  # inference()'s body, first layer
            hidden_x = model.layers[0](data.blocks[0], data.node_features["feat"])
            assert hidden_x.shape == (len(data.seed_nodes), 16)


def test_a_typed_stores_graphbolt_names_are_per_type(tmp_path) -> None:
    store = gnnssd.Store.open(write_store(tmp_path / "typed", ToyHeteroSource()))
    papers = torch.from_numpy(np.asarray(store.train_idx))
    item_sets = gb.ItemSetDict({"paper": gb.ItemSet(papers, names="seed_nodes")})
    with gnnssd.NodeLoader(store, item_sets, fanouts=[3, 3], batch_size=64, device="cpu") as loader:
        data = next(iter(loader))
    assert set(data.node_features) == {(name, "feat") for name in data.x}
    assert data.node_features[("paper", "feat")] is data.x["paper"]
    assert set(data.labels) == {"paper"} and data.labels["paper"] is data.y
    assert data.seed_nodes is data.output_nodes


def test_item_sets_of_the_wrong_kind_or_labels_are_refused_by_name(store) -> None:
    ids = np.asarray(store.train_idx)
    pairs = gb.ItemSet(torch.zeros(4, 2, dtype=torch.int64), names="node_pairs")
    with pytest.raises(ValueError, match=r"seeds: a GraphBolt ItemSet of \('node_pairs',\); a NodeLoader takes an "
                                         r"ItemSet of seed_nodes .*gnnssd.EdgeLoader"):
        gnnssd.NodeLoader(store, pairs, fanouts=[3], batch_size=64, device="cpu")
    wrong = _labels_of(store, ids)
    wrong[5] = (wrong[5] + 1) % store.num_classes
    mislabelled = gb.ItemSet((torch.from_numpy(ids), torch.from_numpy(wrong)), names=("seed_nodes", "labels"))
    with pytest.raises(ValueError, match=rf"seeds: the ItemSet labels seed 5 \(of {len(ids)}\) {wrong[5]}, the store "
                                         r".* \(1 differ\); a mini-batch's labels come from the store"):
        gnnssd.NodeLoader(store, mislabelled, fanouts=[3], batch_size=64, device="cpu")
    as_pairs = np.stack([ids, _labels_of(store, ids)], axis=1)  # (seed, label) pairs as one array
    with pytest.raises(ValueError, match=r"seeds: shape \(\d+, 2\); expected a 1-D array of node IDs or a boolean "
                                         r"mask \(or a GraphBolt ItemSet .*pass its node column, e.g. pairs\[:, 0\]"):
        gnnssd.NodeLoader(store, as_pairs, fanouts=[3], batch_size=64, device="cpu")


@pytest.mark.parametrize("name,method", [
    ("labor", "labor"), ("LABOR", "labor"), ("sample_layer_neighbor", "labor"), ("LaborSampler", "labor"),
    ("layer-neighbor", "labor"), ("uniform", "uniform"), ("Uniform", "uniform"), ("sample_neighbor", "uniform"),
    ("neighbor", "uniform"), ("NeighborSampler", "uniform"), (" neighbour ", "uniform"),
])
def test_graphbolt_and_dgl_method_names_are_aliases(store, name, method) -> None:
    assert sampling_method(name) == method
    with gnnssd.NodeLoader(store, store.train_idx, fanouts=[3], batch_size=64, method=name, device="cpu") as loader:
        assert loader.source.sampling.method == method


@pytest.mark.parametrize("name", ["labr", "", None, 3])
def test_an_unknown_method_name_lists_the_choices(name) -> None:
    with pytest.raises(ValueError, match=r"method: .*; expected one of \('uniform', 'labor'\) \(or GraphBolt's and "
                                         r"DGL's names: .*sample_layer_neighbor"):
        sampling_method(name)
