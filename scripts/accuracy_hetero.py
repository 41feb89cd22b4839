"""Do the relations matter, and does ssd mode keep them? Test accuracy on the synthetic
MAG-like graph (`--preset mag-small`), same seeds for every row:

- `rgcn memory` / `rgcn ssd`: R-GCN on the heterogeneous store (ssd: features streamed
  through the io_engine with a small hot cache); `rgat memory`: R-GAT (4 heads);
- `sage flattened`: GraphSAGE on the same graph flattened to one node type and one
  relation (featureless types given zero rows): what forgetting the relations costs;
- `mlp`: the papers' own features only (the flattened store's MLP: a paper's row).

Prints a table (mean and each seed) and writes {"rows": [...]} with --json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from gnnssd.core.config import config_from_dict
from gnnssd.datasets import hetero_synthetic_source
from gnnssd.datasets.flatten import FlattenedSource
from gnnssd.storage_format import Store, write_store
from gnnssd.training.tasks import Trainer

SAMPLER = {"fanouts": [10, 10], "batch_size": 512, "eval_fanouts": [10, 10], "eval_batch_size": 2048}
TRAIN = {"epochs": 10, "lr": 0.01, "progress": False}
# A budget just above the least ssd mode takes, hot_fraction 0.1: most rows come off the disk.
SSD = {"memory_budget": "15MiB", "hot_fraction": 0.1, "mega_batch": 4}
SYSTEMS = {  # row -> (store, model, features)
    "rgcn memory": ("typed", "rgcn", "memory"),
    "rgcn ssd": ("typed", "rgcn", "ssd"),
    "rgat memory": ("typed", "rgat", "memory"),
    "sage flattened": ("flat", "sage", "memory"),
    "mlp": ("flat", "mlp", "memory"),
}


def trained_accuracy(store: Path, run_dir: Path, model: str, features: str, seed: int, epochs: int) -> float:
    config = config_from_dict({"store": str(store), "run_dir": str(run_dir), "features": features,
                               "seed": seed, "model": {"name": model, "hidden": 64, "layers": 2},
                               "sampler": SAMPLER, "train": dict(TRAIN, epochs=epochs), "ssd": SSD})
    trainer = Trainer(config)
    try:
        trainer.fit()
        trainer.load_best()
        return trainer.evaluate("test")["accuracy"]
    finally:
        trainer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="mag-small")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=TRAIN["epochs"])
    parser.add_argument("--quick", action="store_true", help="one seed, two epochs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.epochs = 1, 2
    rows = []
    with tempfile.TemporaryDirectory() as work:
        source = hetero_synthetic_source(args.preset)
        stores = {"typed": write_store(Path(work) / "typed", source),
                  "flat": write_store(Path(work) / "flat", FlattenedSource(source))}
        feature_mib = Store.open(stores["typed"]).feature_bytes / 2**20
        for name, (store, model, features) in SYSTEMS.items():
            accuracy = [trained_accuracy(stores[store], Path(work) / f"{name}-{s}".replace(" ", "-"), model,
                                      features, s, args.epochs) for s in range(args.seeds)]
            rows.append({"system": name, "model": model, "features": features, "store": store,
                         "feature_mib": round(feature_mib, 2), "test_acc": accuracy,
                         "mean": statistics.mean(accuracy),
                         "stdev": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0})
            print(f"{name}: {accuracy}", flush=True)
    print(f"{'system':16} {'test acc mean':>14} {'stdev':>7}  per seed")
    for r in rows:
        print(f"{r['system']:16} {r['mean']:>14.4f} {r['stdev']:>7.4f}  "
              + " ".join(f"{a:.4f}" for a in r["test_acc"]))
    memory, ssd = (next(r["mean"] for r in rows if r["system"] == s) for s in ("rgcn memory", "rgcn ssd"))
    print(f"rgcn ssd - memory: {100 * (ssd - memory):+.2f} points")
    if args.json:
        args.json.write_text(json.dumps({"preset": args.preset, "rows": rows,
                                         "ssd_minus_memory_points": 100 * (ssd - memory)}, indent=2))


if __name__ == "__main__":
    main()
