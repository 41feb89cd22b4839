"""Your own model in your own training loop, fed by gnnssd.NodeLoader.

The model is not one of gnnssd's built-ins: a GIN layer from dgl.nn, then a hand-written
message-passing layer (DGL-style message and reduce functions) compiled by gnnssd's
MP-DFG compiler. Features stream from the SSD (`--features ssd`) or sit in memory
(`--features memory`); the loop is the same either way.

    python examples/custom_model.py --planetoid ../shared/datasets/planetoid --features ssd
    python examples/custom_model.py --store stores/cora --features memory --seed 1
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import dgl.nn
import torch
import torch.nn.functional as F
from dgl.utils import expand_as_pair
from torch import nn

import gnnssd


class GatedMeanConv(nn.Module):
    """Each neighbour's message is its features scaled by a learned gate; a node takes
    the mean of its messages, plus a projection of itself."""

    def __init__(self, in_feats: int, out_feats: int):
        super().__init__()
        self.gate = nn.Linear(in_feats, 1)
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.fc_self = nn.Linear(in_feats, out_feats)

    def message(self, edges):
        return {"m": torch.sigmoid(self.gate(edges.src["h"])) * edges.src["h"]}

    def reduce(self, nodes):
        return {"neigh": nodes.mailbox["m"].mean(1)}

    def forward(self, block, h):
        with block.local_scope():
            h_src, h_dst = expand_as_pair(h, block)
            block.srcdata["h"] = h_src
            block.update_all(self.message, self.reduce)
            return self.fc_self(h_dst) + self.fc_neigh(block.dstdata["neigh"])


class GINThenGated(nn.Module):
    """Two layers, one per block: GIN (dgl.nn), then the compiled GatedMeanConv."""

    def __init__(self, in_feats: int, hidden: int, classes: int, dropout: float = 0.5):
        super().__init__()
        mlp = nn.Sequential(nn.Linear(in_feats, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.gin = dgl.nn.GINConv(mlp, aggregator_type="sum", learn_eps=True)
        self.gated = gnnssd.compile(GatedMeanConv(hidden, classes))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = self.dropout(F.relu(self.gin(blocks[0], x)))
        return self.gated(blocks[1], h)


def train(store: gnnssd.Store, features: str, seed: int = 0, epochs: int = 30, hidden: int = 64,
          memory_budget: str = "64MiB") -> dict[str, float]:
    """Train on the store's training nodes; the test accuracy of the best-validation epoch."""
    torch.manual_seed(seed)
    model = GINThenGated(store.feat_dim, hidden, store.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best = {"valid": -1.0, "test": 0.0, "epoch": 0}
    with gnnssd.NodeLoader(store, store.train_idx, fanouts=[10, 10], batch_size=128, features=features,
                           memory_budget=memory_budget, shuffle=True, seed=seed, device="cpu",
                           eval_fanouts=[-1, -1], eval_batch_size=1024) as loader:
        splits = {name: loader.with_seeds(store.split(name), fanouts=[-1, -1], batch_size=1024)
                  for name in ("valid", "test")}
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            model.train()
            for mb in loader:
                loss = F.cross_entropy(model(mb.blocks, mb.x), mb.y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            scores = {name: accuracy(model, split) for name, split in splits.items()}
            if scores["valid"] > best["valid"]:
                best = {**scores, "epoch": epoch}
        best["io_bytes_read"] = loader.io_stats()["bytes_read"]
    return best


@torch.no_grad()
def accuracy(model: nn.Module, loader: gnnssd.NodeLoader) -> float:
    model.eval()
    right = total = 0
    for mb in loader:
        right += int((model(mb.blocks, mb.x).argmax(1) == mb.y).sum())
        total += len(mb.y)
    return right / max(total, 1)


def cora_store(planetoid_root: Path, out: Path) -> gnnssd.Store:
    """Cora preprocessed into a store (hot rows first), as `gnnssd preprocess` does."""
    from gnnssd.datasets import PlanetoidSource
    from gnnssd.sampler import node_order
    from gnnssd.storage_format import write_store

    return gnnssd.Store.open(write_store(out, PlanetoidSource(planetoid_root, "cora"), order=node_order("degree")))


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", type=Path, help="a store made by `gnnssd preprocess`")
    where.add_argument("--planetoid", type=Path, help="Planetoid files: preprocess Cora to a temporary store")
    p.add_argument("--features", choices=("memory", "ssd"), default="ssd")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=30)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        store = gnnssd.Store.open(args.store) if args.store else cora_store(args.planetoid, Path(scratch) / "cora")
        best = train(store, args.features, args.seed, args.epochs)
    print(f"{args.features}: seed {args.seed}: test accuracy {best['test']:.4f} at the best validation "
          f"epoch {best['epoch']} (valid {best['valid']:.4f}); {best['io_bytes_read']:,} bytes read from disk")
    return best


if __name__ == "__main__":
    main()
