"""Layer-wise inference (`gnnssd embed` / `predict --layerwise`) with a model of your own.

Layer-wise inference computes one layer for every node before the next, over all
in-neighbours, reading each layer's input from disk in chunks of destination nodes. It
calls the model one layer at a time, so a model exposes this per-layer protocol:

    num_layers            how many layers
    layer(i, block, h)    layer i on one DGL block (h: its source rows), activation included
    mean_aggregation(i)   optional: True if layer i is GraphSAGE-mean (sequential passes)

`forward(blocks, x)` for training is then just the layers in turn, as below.

    python examples/layerwise_user_model.py STORE [--features ssd] [--memory-budget 64MiB]
"""
from __future__ import annotations

import argparse
import tempfile

import dgl.nn as dglnn
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import gnnssd
from gnnssd.core.config import SSDConfig
from gnnssd.inference.layerwise import layerwise_inference


class GraphConvNet(nn.Module):
    """Two GraphConv layers, with the per-layer protocol. norm="right" (the mean over
    in-neighbours) depends on a node's own in-degree only, so any chunking of the
    destinations computes the same layer ("both" would use the degrees inside a block)."""

    def __init__(self, in_size: int, hidden: int, out_size: int):
        super().__init__()
        self.convs = nn.ModuleList([dglnn.GraphConv(in_size, hidden, norm="right", allow_zero_in_degree=True),
                                    dglnn.GraphConv(hidden, out_size, norm="right", allow_zero_in_degree=True)])

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def layer(self, i: int, block, h: torch.Tensor) -> torch.Tensor:
        h = self.convs[i](block, h)
        return F.relu(h) if i < self.num_layers - 1 else h

    def forward(self, blocks, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(blocks):
            x = self.layer(i, block, x)
        return x


def train(store: gnnssd.Store, features: str = "memory", memory_budget: str = "64MiB", epochs: int = 5) -> nn.Module:
    """The model trained with a NodeLoader, DGL style."""
    model = GraphConvNet(store.feat_dim, 64, store.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with gnnssd.NodeLoader(store, store.train_idx, fanouts=[10, 10], batch_size=256, shuffle=True,
                           features=features, memory_budget=memory_budget, device="cpu") as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for input_nodes, output_nodes, blocks in loader:
                loss = F.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
    return model


@torch.no_grad()
def layerwise_logits(model: nn.Module, store: gnnssd.Store, features: str = "memory",
                     memory_budget: str = "64MiB") -> np.ndarray:
    """Every node's logits by layer-wise inference, row k for the dataset's node k."""
    with tempfile.TemporaryDirectory() as scratch:
        chunks = layerwise_inference(model, store, features, SSDConfig(memory_budget=memory_budget), scratch)
        return np.concatenate(list(chunks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--features", default="memory", choices=("memory", "ssd"))
    parser.add_argument("--memory-budget", default="64MiB")
    args = parser.parse_args()
    store = gnnssd.Store.open(args.store)
    model = train(store, args.features, args.memory_budget)
    predicted = layerwise_logits(model, store, args.features, args.memory_budget).argmax(1)
    labels = np.asarray(store.labels)[np.asarray(store.inv)]  # by the dataset's node ID
    test = store.test_idx
    print(f"test accuracy (layer-wise) {np.mean(predicted[test] == labels[test]):.4f}")


if __name__ == "__main__":
    main()
