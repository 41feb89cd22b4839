#!/usr/bin/env python3
"""LABOR (layer-neighbour) sampling beside uniform neighbour sampling at the same fanouts.

Rows, bytes and speed (`--preset`, a synthetic store; default `medium`): one epoch of
NodeLoader over the training seeds per method and feature mode (both sample with gnnssd's
numba kernels; memory: features in RAM; ssd: the planner and io_uring within `--budget`),
reporting distinct input rows per mini-batch, mini-batches per second, process CPU per
mini-batch, the loader's own stage times (memory mode: sample, gather, transfer), and for
ssd the bytes read from the disk per useful byte (bytes_read / useful_bytes: the cold rows
the mini-batches needed; the hot cache's set-up read is left out) and the bytes read per
mini-batch. Methods alternate in one run, same seeds.

Accuracy (Cora, CiteSeer from the shared Planetoid files, `--seeds` seeds): GraphSAGE
trained by gnnssd's Trainer with `sampler.method` uniform and labor (evaluation samples
by the same method, fanouts 10,10), memory and ssd (32 MiB budget) features; mean test accuracy and the
distinct input rows per training mini-batch.

    python scripts/bench_labor.py [--preset medium | --store STORE] [--features memory,ssd] [--repeats 3]
        [--seeds 3] [--json bench_out/labor.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from gnnssd import NodeLoader, Store
from gnnssd.core.config import config_from_dict
from gnnssd.datasets import PlanetoidSource, synthetic_source
from gnnssd.storage_format import write_store
from gnnssd.training.tasks import Trainer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
METHODS = ("uniform", "labor")
PLANETOID = {"model": {"name": "sage", "hidden": 64, "layers": 2},
             "train": {"epochs": 50, "lr": 0.01, "weight_decay": 5e-4, "progress": False},
             "sampler": {"fanouts": [10, 10], "batch_size": 35, "eval_fanouts": [10, 10], "eval_batch_size": 500}}


def epoch_of(store: Store, method: str, features: str, fanouts: list[int], batch_size: int,
             budget: str, batches: int) -> dict:
    """One epoch of `batches` mini-batches: rows, speed, and (ssd) disk bytes."""
    seeds = np.random.default_rng(0).permutation(np.asarray(store.train_idx))[:batches * batch_size]
    with NodeLoader(store, seeds, fanouts=fanouts, batch_size=batch_size, features=features, method=method,
                    memory_budget=budget, seed=0, device="cpu") as loader:
        loader.io_stats()  # the set-up (feature load, hot cache) left out
        loader.stage_times()
        rows, start, cpu = [], time.perf_counter(), time.process_time()
        for mb in loader:
            rows.append(len(mb.input_nodes))
            mb.x.sum()  # the inputs touched
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        io = loader.io_stats()
        stages = loader.stage_times()
    row = {"method": method, "features": features, "minibatches": len(rows),
           "input_rows_per_minibatch": statistics.mean(rows), "minibatches_per_s": len(rows) / seconds,
           "cpu_s_per_minibatch": cpu / len(rows),
           "stage_s_per_minibatch": {name: s / len(rows) for name, s in stages.items()}}
    if features == "ssd":
        row.update(bytes_read=io["bytes_read"], useful_bytes=io["useful_bytes"],
                   bytes_read_per_useful_byte=io["bytes_read"] / max(io["useful_bytes"], 1),
                   bytes_read_per_minibatch=io["bytes_read"] / len(rows))
    return row


def accuracy(store: Path, run_dir: Path, method: str, features: str, seed: int) -> tuple[float, float]:
    """(test accuracy, mean distinct input rows per training mini-batch)."""
    spec = PLANETOID
    config = config_from_dict({"store": str(store), "run_dir": str(run_dir), "features": features, "seed": seed,
                               "model": spec["model"], "train": spec["train"],
                               "sampler": dict(spec["sampler"], method=method), "ssd": {"memory_budget": "32MiB"}})
    trainer = Trainer(config)
    try:
        trainer.fit()
        acc = trainer.evaluate("test")["accuracy"]
    finally:
        trainer.close()
    opened = Store.open(store)
    with NodeLoader(opened, opened.train_idx, fanouts=spec["sampler"]["fanouts"], batch_size=35, shuffle=True,
                    method=method, seed=seed, device="cpu") as loader:
        rows = statistics.mean(len(mb.input_nodes) for mb in loader)
    return acc, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="medium", help="synthetic preset of the rows/bytes part ('' to skip)")
    parser.add_argument("--store", type=Path, help="an existing store instead of writing --preset")
    parser.add_argument("--budget", default="256MiB", help="ssd.memory_budget of the bytes part")
    parser.add_argument("--batches", type=int, default=40, help="mini-batches per epoch of the bytes part")
    parser.add_argument("--repeats", type=int, default=1, help="epochs per method of the bytes part, alternating")
    parser.add_argument("--features", default="memory,ssd", help="feature modes of the bytes part, comma-separated")
    parser.add_argument("--seeds", type=int, default=3, help="training seeds per accuracy cell (0 to skip)")
    parser.add_argument("--datasets", default="cora,citeseer")
    parser.add_argument("--planetoid", type=Path, default=SHARED / "planetoid", help="the ind.NAME.* files")
    parser.add_argument("--json", type=Path, default=Path("bench_out/labor.json"))
    args = parser.parse_args()
    out: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": [], "accuracy": []}
    with tempfile.TemporaryDirectory(dir=args.json.parent if args.json.parent.exists() else None) as work:
        work = Path(work)
        if args.store or args.preset:
            path = args.store or write_store(work / args.preset, synthetic_source(args.preset))
            store = Store.open(path)
            print(f"{'method':8} {'features':8} {'rows/mb':>9} {'mb/s':>7} {'CPU s/mb':>8} {'read/useful':>11} "
                  f"{'MiB read/mb':>11}")
            for features in args.features.split(","):
                for method in METHODS:  # warm-up: numba's compilation and first calls left out
                    epoch_of(store, method, features, [15, 10, 5], 1024, args.budget, 1)
                for _ in range(args.repeats):  # methods alternating: load that drifts hits both
                    for method in METHODS:
                        row = epoch_of(store, method, features, [15, 10, 5], 1024, args.budget, args.batches)
                        out["rows"].append(row)
                        print(f"{method:8} {features:8} {row['input_rows_per_minibatch']:9.0f} "
                              f"{row['minibatches_per_s']:7.2f} {row['cpu_s_per_minibatch']:8.3f} "
                              f"{row.get('bytes_read_per_useful_byte', float('nan')):11.2f} "
                              f"{row.get('bytes_read_per_minibatch', float('nan')) / 2**20:11.2f}")
                speed, cpu = ({m: statistics.median(r[key] for r in out["rows"]
                                                    if r["method"] == m and r["features"] == features)
                               for m in METHODS} for key in ("minibatches_per_s", "cpu_s_per_minibatch"))
                print(f"{'':8} {features:8} labor / uniform speed (median of {args.repeats}): "
                      f"{speed['labor'] / speed['uniform']:.2f}x; CPU seconds uniform / labor: "
                      f"{cpu['uniform'] / cpu['labor']:.2f}x")
                for method in METHODS:  # where the wall goes: the loader's own stage timer
                    runs = [r["stage_s_per_minibatch"] for r in out["rows"]
                            if r["method"] == method and r["features"] == features]
                    parts = {name: statistics.median(r.get(name, 0.0) for r in runs) for name in runs[0]}
                    print(f"{'':8} {features:8} {method} ms per mini-batch by stage (medians): "
                          + ", ".join(f"{name} {1e3 * v:.2f}" for name, v in parts.items()))
        print(f"\n{'dataset':9} {'features':8} {'method':8} {'test acc':>9} {'rows/mb':>8}")
        for name in [d for d in args.datasets.split(",") if d and args.seeds]:
            path = write_store(work / name, PlanetoidSource(args.planetoid, name))
            for features in ("memory", "ssd"):
                for method in METHODS:
                    runs = [accuracy(path, work / f"run-{name}-{features}-{method}-{s}", method, features, s)
                            for s in range(args.seeds)]
                    accs = [a for a, _ in runs]
                    cell = {"dataset": name, "features": features, "method": method, "accuracies": accs,
                            "mean": statistics.mean(accs), "std": statistics.pstdev(accs),
                            "input_rows_per_minibatch": statistics.mean(r for _, r in runs)}
                    out["accuracy"].append(cell)
                    print(f"{name:9} {features:8} {method:8} {100 * cell['mean']:6.2f}+-{100 * cell['std']:.2f} "
                          f"{cell['input_rows_per_minibatch']:8.0f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
