#!/usr/bin/env python3
"""The built-in R-GCN / R-GAT beside DGL's own R-GCN example model on the synthetic MAG-like
graph (`--preset mag-small`): same store, loader, Trainer, optimiser, epochs and seeds;
only the model differs. Test accuracy of the best validation epoch, mean over seeds.

Rows: `rgcn embedding` / `rgcn zeros` (the built-in model, featureless types as learnable
xavier-initialised embeddings / as zeros), `rgat embedding`, and `dgl example`: the
architecture of DGL's examples/core/rgcn/hetero_rgcn.py, written here from its
description: per relation dgl.nn.GraphConv(norm="right", weight=False, bias=False) fed the
relation's own bias-free Linear weight, summed by HeteroGraphConv, plus a per-type
self-loop Linear with bias; ReLU and dropout 0.5 after the first layer; featureless types
from dgl.nn.HeteroEmbedding. Hidden 64, 2 layers for every row.

    python scripts/accuracy_rgcn_dgl.py [--seeds 3] [--epochs 10] [--json bench_out/rgcn_dgl.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import dgl
import dgl.nn as dglnn
import torch
from torch import nn

from gnnssd.core.config import config_from_dict
from gnnssd.datasets import hetero_synthetic_source
from gnnssd.storage_format import Store, write_store
from gnnssd.training.tasks import Trainer

SAMPLER = {"fanouts": [10, 10], "batch_size": 512, "eval_fanouts": [10, 10], "eval_batch_size": 2048}
HIDDEN = 64


class ExampleLayer(nn.Module):
    """One layer of DGL's hetero_rgcn example: mean per relation with the relation's own
    weight, summed over relations, plus a self-loop map per node type."""

    def __init__(self, d_in: int, d_out: int, ntypes: list[str], relations: list[str], last: bool):
        super().__init__()
        self.conv = dglnn.HeteroGraphConv({r: dglnn.GraphConv(d_in, d_out, norm="right", weight=False, bias=False)
                                           for r in relations})
        self.weight = nn.ModuleDict({r: nn.Linear(d_in, d_out, bias=False) for r in relations})
        self.loop = nn.ModuleDict({t: nn.Linear(d_in, d_out) for t in ntypes})
        self.last = last
        self.dropout = nn.Dropout(0.5)

    def forward(self, block: dgl.DGLGraph, h: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.conv(block, h, mod_kwargs={r: {"weight": w.weight.T} for r, w in self.weight.items()})
        result = {}
        for t, value in out.items():
            value = value + self.loop[t](h[t][: block.num_dst_nodes(t)])
            result[t] = value if self.last else self.dropout(torch.relu(value))
        return result


class ExampleModel(nn.Module):
    """DGL's example model behind gnnssd's model protocol: forward(blocks, x) -> logits."""

    def __init__(self, store: Store, num_classes: int):
        super().__init__()
        schema = store.schema
        self.target = schema.target
        self.embed = dglnn.HeteroEmbedding({t.name: t.count for t in schema.node_types if not t.features},
                                           store.feat_dim)
        ntypes, relations = schema.type_names, sorted({r for _, r, _ in schema.relations})
        self.layers = nn.ModuleList([ExampleLayer(store.feat_dim, HIDDEN, ntypes, relations, False),
                                     ExampleLayer(HIDDEN, num_classes, ntypes, relations, True)])

    def forward(self, blocks: list[dgl.DGLGraph], x: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = {t: blocks[0].srcnodes[t].data[dgl.NID] for t in self.embed.embeds.keys()}
        h = {**self.embed(ids), **x}
        for layer, block in zip(self.layers, blocks):
            h = layer(block, h)
        return h[self.target]


def accuracy(store: Path, run_dir: Path, row: str, seed: int, epochs: int) -> float:
    name, featureless = ("rgcn", "embedding") if row == "dgl example" else row.split()
    config = config_from_dict({"store": str(store), "run_dir": str(run_dir), "features": "memory", "seed": seed,
                               "model": {"name": name, "hidden": HIDDEN, "layers": 2, "featureless": featureless},
                               "sampler": SAMPLER, "train": {"epochs": epochs, "lr": 0.01, "progress": False}})
    model = None
    if row == "dgl example":
        torch.manual_seed(seed)
        opened = Store.open(store)
        model = ExampleModel(opened, opened.num_classes)
    trainer = Trainer(config, model=model)
    try:
        trainer.fit()
        trainer.load_best()
        return trainer.evaluate("test")["accuracy"]
    finally:
        trainer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="mag-small")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rows", default="rgcn embedding,rgcn zeros,rgat embedding,dgl example")
    parser.add_argument("--json", type=Path, default=Path("bench_out/rgcn_dgl.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        store = write_store(Path(work) / args.preset, hetero_synthetic_source(args.preset))
        print(f"{'model':16} {'test acc':>12}  per seed")
        for row in args.rows.split(","):
            accs = [accuracy(store, Path(work) / f"run-{row}-{s}".replace(" ", "-"), row, s, args.epochs)
                    for s in range(args.seeds)]
            rows.append({"model": row, "epochs": args.epochs, "accuracies": accs, "mean": statistics.mean(accs),
                         "std": statistics.pstdev(accs)})
            print(f"{row:16} {100 * rows[-1]['mean']:6.2f}+-{100 * rows[-1]['std']:.2f}  "
                  + " ".join(f"{100 * a:.2f}" for a in accs), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"preset": args.preset, "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
