"""Same config and seeds, `features: memory` vs `features: ssd` (and `features: device`,
the whole store on the device, here the CPU): mean test accuracy.

The Planetoid and heterophilous graphs are small, so the ssd runs get no hot cache
(hot_fraction 0): every input row of every mega-batch comes from features.bin through the
io_engine (or is carried over from the previous buffer). `medium` (synthetic, 2.5M nodes)
has no source here: pass its built store (`--store medium=DIR`); it trains a measured part
of each epoch (train.max_batches), which reaches a stable accuracy on two loaded cores.
Each seed runs every mode in turn (a slow machine's drift falls on all modes alike), and
--json is rewritten after every run, so a stopped run keeps the seeds it finished.
Prints a table and writes {"rows": [...]} with --json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from gnnssd.core.config import config_from_dict
from gnnssd.datasets import HeterophilousSource, PlanetoidSource
from gnnssd.storage_format import Store, write_store
from gnnssd.training.tasks import Trainer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"

DATASETS = {
    "cora": {
        "source": lambda: PlanetoidSource(SHARED / "planetoid", "cora"),
        "model": {"name": "sage", "hidden": 64, "layers": 2},
        "sampler": {"fanouts": [10, 10], "batch_size": 140, "eval_fanouts": [10, 10], "eval_batch_size": 500},
        "train": {"epochs": 50, "lr": 0.01, "weight_decay": 5e-4},
        "ssd": {"memory_budget": "64MiB", "hot_fraction": 0.0, "mega_batch": 1},
    },
    "tolokers": {
        "source": lambda: HeterophilousSource(SHARED / "heterophilous" / "tolokers.npz", split=0),
        "model": {"name": "sage", "hidden": 64, "layers": 2},
        "sampler": {"fanouts": [10, 10], "batch_size": 512, "eval_fanouts": [10, 10], "eval_batch_size": 512},
        "train": {"epochs": 20, "lr": 0.01},
        "ssd": {"memory_budget": "13MiB", "hot_fraction": 0.0, "mega_batch": 2},
    },
    "medium": {
        "source": None,  # a built store: --store medium=DIR (gnnssd preprocess synthetic --preset medium)
        "model": {"name": "sage", "hidden": 64, "layers": 2},
        "sampler": {"fanouts": [10, 10], "batch_size": 1024, "eval_fanouts": [10, 10], "eval_batch_size": 4096},
        "train": {"epochs": 3, "max_batches": 40, "eval_every": 3, "lr": 0.01},
        "ssd": {"memory_budget": "256MiB", "hot_fraction": 0.0, "mega_batch": 2},
    },
}


def run(store: Path, run_dir: Path, spec: dict, features: str, seed: int, epochs: int | None) -> float:
    train = dict(spec["train"], progress=False, **({"epochs": epochs} if epochs else {}))
    config = config_from_dict({"store": str(store), "run_dir": str(run_dir), "features": features,
                               "seed": seed, "model": spec["model"], "sampler": spec["sampler"],
                               "train": train, "ssd": spec["ssd"]})
    trainer = Trainer(config)
    trainer.fit()
    accuracy = trainer.evaluate("test")["accuracy"]
    trainer.close()
    return accuracy


def built_stores(pairs: list[str]) -> dict[str, Path]:
    """--store NAME=DIR pairs by dataset name."""
    stores = {}
    for pair in pairs:
        name, sep, folder = pair.partition("=")
        if not sep or name not in DATASETS:
            raise SystemExit(f"--store {pair!r}: expected NAME=DIR with NAME one of {', '.join(DATASETS)}")
        stores[name] = Path(folder)
    return stores


def differences(row: dict, modes: list[str]) -> None:
    """Each mode's mean and its difference from memory mode's, in points, into `row`."""
    for mode in modes:
        row[f"{mode}_mean"] = statistics.mean(row[f"{mode}_acc"])
    for mode in modes[1:]:  # "difference_points": ssd's, as earlier runs wrote it
        key = "difference_points" if mode == "ssd" else f"{mode}_difference_points"
        row[key] = 100 * (row[f"{mode}_mean"] - row["memory_mean"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer epochs")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--datasets", default=",".join(name for name, spec in DATASETS.items() if spec["source"]),
                        help=f"some of {','.join(DATASETS)}")
    parser.add_argument("--modes", default="ssd,device", help="the modes compared with memory: ssd, device")
    parser.add_argument("--store", action="append", default=[], metavar="NAME=DIR",
                        help="a built store for dataset NAME (medium has no other)")
    args = parser.parse_args()
    modes = ["memory", *args.modes.split(",")]
    stores = built_stores(args.store)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.datasets.split(","):
            spec = DATASETS[name]
            if name in stores:
                store = stores[name]
            elif spec["source"] is None:
                raise SystemExit(f"dataset {name}: pass its built store with --store {name}=DIR")
            else:
                store = write_store(Path(work) / name, spec["source"]())
            feature_mib = Store.open(store).feature_bytes / 2**20
            row = {"dataset": name, "feature_mib": round(feature_mib, 2), "ssd_budget": spec["ssd"]["memory_budget"],
                   "seeds": 0, **{f"{mode}_acc": [] for mode in modes}}
            rows.append(row)
            for seed in range(args.seeds):
                for mode in modes:
                    row[f"{mode}_acc"].append(run(store, Path(work) / f"{name}-{mode}-{seed}", spec, mode, seed,
                                                  5 if args.quick else None))
                row["seeds"] = seed + 1
                differences(row, modes)
                print(json.dumps({k: row[k] for k in ["dataset", "seeds", *(f"{m}_acc" for m in modes)]}), flush=True)
                if args.json:
                    args.json.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"{'dataset':10} {'features':>9} {'budget':>7} " + " ".join(f"{m + ' mean':>12}" for m in modes)
          + " " + " ".join(f"{m + '-mem (pts)':>16}" for m in modes[1:]))
    for r in rows:
        diffs = [r["difference_points" if m == "ssd" else f"{m}_difference_points"] for m in modes[1:]]
        print(f"{r['dataset']:10} {r['feature_mib']:>7.2f}Mi {r['ssd_budget']:>7} "
              + " ".join(f"{r[m + '_mean']:>12.4f}" for m in modes) + " " + " ".join(f"{d:>16.2f}" for d in diffs))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
