"""GraphSAGE node classification, written the way DGL's examples write their loop, with
gnnssd's loader in place of DGL's DataLoader, and validation every `--eval-every` steps in
the middle of the epoch (the loaders share one feature source; interleaving is safe).

    python examples/node_classification.py STORE [--features ssd] [--memory-budget 64MiB]

The lines a DGL user changes are marked `# gnnssd`: the loader (and its evaluation loader);
the loop itself, `for input_nodes, output_nodes, blocks in loader`, with the features in
`blocks[0].srcdata["feat"]` and the labels in `blocks[-1].dstdata["label"]`, is DGL's.
"""
from __future__ import annotations

import argparse

import dgl.nn as dglnn
import torch
import torch.nn.functional as F
from torch import nn

import gnnssd


class SAGE(nn.Module):
    def __init__(self, in_size: int, hidden: int, out_size: int, layers: int = 2, dropout: float = 0.5):
        super().__init__()
        sizes = [in_size] + [hidden] * (layers - 1) + [out_size]
        self.layers = nn.ModuleList(dglnn.SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


@torch.no_grad()
def evaluate(model: nn.Module, loader) -> float:
    model.eval()
    right = total = 0
    for input_nodes, output_nodes, blocks in loader:
        x, y = blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]
        right += int((model(blocks, x).argmax(1) == y).sum())
        total += len(y)
    model.train()
    return right / max(total, 1)


def train(store_path: str, features: str = "memory", memory_budget: str = "64MiB", epochs: int = 10,
          eval_every: int = 5, batch_size: int = 128, lr: float = 0.003, seed: int = 0,
          max_steps: int | None = None) -> dict[str, float]:
    """Train, validating every `eval_every` steps; the test accuracy of the best-validation model."""
    torch.manual_seed(seed)
    store = gnnssd.Store.open(store_path)
    model = SAGE(store.feat_dim, 128, store.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    # gnnssd: in place of dgl.dataloading.DataLoader(graph, train_idx, NeighborSampler([10, 10]), ...)
    loader = gnnssd.NodeLoader(store, store.train_idx, fanouts=[10, 10], batch_size=batch_size, shuffle=True,
                               features=features, memory_budget=memory_budget, seed=seed, device="cpu")
    val_loader = loader.with_seeds(store.valid_idx, fanouts=[-1, -1], batch_size=1024)  # gnnssd
    test_loader = loader.with_seeds(store.test_idx, fanouts=[-1, -1], batch_size=1024)  # gnnssd
    best = {"valid": -1.0, "test": 0.0, "step": 0}
    step = 0
    with loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)  # gnnssd: a new shuffle and new neighbours each epoch
            for input_nodes, output_nodes, blocks in loader:
                x, y = blocks[0].srcdata["feat"], blocks[-1].dstdata["label"]
                loss = F.cross_entropy(model(blocks, x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if step % eval_every == 0:
                    valid = evaluate(model, val_loader)
                    if valid > best["valid"]:
                        best = {"valid": valid, "test": evaluate(model, test_loader), "step": step}
                if max_steps is not None and step >= max_steps:
                    return best
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--features", default="memory", choices=("memory", "ssd"))
    parser.add_argument("--memory-budget", default="64MiB")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=5)
    args = parser.parse_args()
    best = train(args.store, args.features, args.memory_budget, args.epochs, args.eval_every)
    print(f"best valid {best['valid']:.4f} at step {best['step']}, test {best['test']:.4f}")


if __name__ == "__main__":
    main()
