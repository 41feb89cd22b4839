#!/usr/bin/env python3
"""Accuracy of the options that change what is trained: a locality node order with the
proximity seed order, int8 and float16 feature rows, and sample reuse, against float32 in
memory; same configs and seeds (0, 1, 2), mean test accuracy, the difference in points.

Variants (all `features: memory`, so only what the option changes differs):
  float32            original order, random seed order (the reference)
  metis+proximity    metis node order, `sampler.seed_order: proximity`
  int8               original order, int8 rows (dequantized when memory mode loads them)
  int8+metis+prox    both
  float16            original order, float16 rows
  reuse2, reuse4     original order, `sampler.reuse_epochs` 2 / 4: the same number of epochs
                     on half / a quarter as many samples (lever 4)

The proximity window is two mini-batches here (these training sets are a few thousand
nodes: the default window of 16,384 seeds would hold the whole set, i.e. a plain shuffle);
Cora and CiteSeer train in mini-batches of 35 of their 140/120 training nodes so that an
epoch has several mini-batches to order.

    python scripts/accuracy_levers.py [--seeds 3] [--json bench_out/accuracy_levers.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from gnnssd.core.config import config_from_dict
from gnnssd.datasets import HeterophilousSource, PlanetoidSource
from gnnssd.sampler import node_order
from gnnssd.storage_format import write_store
from gnnssd.training.tasks import Trainer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
SAGE = {"name": "sage", "hidden": 64, "layers": 2}
PLANETOID = {"model": SAGE, "train": {"epochs": 50, "lr": 0.01, "weight_decay": 5e-4},
             "sampler": {"fanouts": [10, 10], "batch_size": 35, "eval_fanouts": [10, 10], "eval_batch_size": 500}}
HETEROPHILOUS = {"model": SAGE, "train": {"epochs": 20, "lr": 0.01},
                 "sampler": {"fanouts": [10, 10], "batch_size": 512, "eval_fanouts": [10, 10], "eval_batch_size": 512}}
DATASETS = {
    "cora": (lambda: PlanetoidSource(SHARED / "planetoid", "cora"), PLANETOID),
    "citeseer": (lambda: PlanetoidSource(SHARED / "planetoid", "citeseer"), PLANETOID),
    "tolokers": (lambda: HeterophilousSource(SHARED / "heterophilous" / "tolokers.npz", split=0), HETEROPHILOUS),
    "minesweeper": (lambda: HeterophilousSource(SHARED / "heterophilous" / "minesweeper.npz", split=0), HETEROPHILOUS),
    "actor": (lambda: HeterophilousSource(SHARED / "heterophilous" / "actor.npz", split=0), HETEROPHILOUS),
}
#: variant -> (node order, feature dtype, proximity seed order, sampler.reuse_epochs)
VARIANTS = {"float32": ("original", "float32", False, 1), "metis+proximity": ("metis", "float32", True, 1),
            "int8": ("original", "int8", False, 1), "int8+metis+prox": ("metis", "int8", True, 1),
            "float16": ("original", "float16", False, 1), "reuse2": ("original", "float32", False, 2),
            "reuse4": ("original", "float32", False, 4)}


def accuracy(store: Path, run_dir: Path, spec: dict, proximity: bool, reuse_epochs: int, seed: int) -> float:
    sampler = dict(spec["sampler"], reuse_epochs=reuse_epochs)
    if proximity:
        sampler.update(seed_order="proximity", seed_window=2 * sampler["batch_size"])
    config = config_from_dict({"store": str(store), "run_dir": str(run_dir), "features": "memory",
                               "seed": seed, "model": spec["model"], "sampler": sampler,
                               "train": dict(spec["train"], progress=False)})
    trainer = Trainer(config)
    try:
        trainer.fit()
        return trainer.evaluate("test")["accuracy"]
    finally:
        trainer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="differences are against float32 when it is among them")
    parser.add_argument("--json", type=Path, default=Path("bench_out/accuracy_levers.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.datasets.split(","):
            source, spec = DATASETS[name]
            stores: dict[tuple[str, str], Path] = {}
            for variant in args.variants.split(","):
                order, dtype, proximity, reuse_epochs = VARIANTS[variant]
                if (order, dtype) not in stores:
                    stores[order, dtype] = write_store(Path(work) / f"{name}-{order}-{dtype}", source(),
                                                       order=node_order(order), dtype=dtype)
                runs = [accuracy(stores[order, dtype], Path(work) / f"{name}-{variant}-{s}", spec, proximity,
                                 reuse_epochs, s) for s in range(args.seeds)]
                rows.append({"dataset": name, "variant": variant, "accuracy": runs, "mean": statistics.mean(runs)})
                print(f"{name} {variant}: {runs}", flush=True)
    print(f"\n{'dataset':12} {'variant':16} {'mean':>7} {'- float32 (pts)':>16} {'within 0.5':>10}")
    for row in rows:
        reference = next((r["mean"] for r in rows if r["dataset"] == row["dataset"] and r["variant"] == "float32"), None)
        if reference is None:  # run without the reference variant
            print(f"{row['dataset']:12} {row['variant']:16} {row['mean']:>7.4f}")
            continue
        row["difference_points"] = round(100 * (row["mean"] - reference), 2)
        row["within_half_point"] = abs(row["difference_points"]) <= 0.5
        print(f"{row['dataset']:12} {row['variant']:16} {row['mean']:>7.4f} {row['difference_points']:>16.2f} "
              f"{'yes' if row['within_half_point'] else 'no':>10}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "seeds": args.seeds}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
