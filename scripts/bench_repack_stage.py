#!/usr/bin/env python3
"""The ssd loader's repack stage alone, this tree beside baseline commits: CPU per window.

bench_feed times the whole loader, whose per-thread figures move by about ±10% between runs
on a shared machine; this measures one repack window's work with nothing else running.
Per tree, in a fresh process: the ssd loader (--budget, default 1/8 of the features as
bench_feed --quick) runs until its first repack window with a compact block is planned; the
loader is then closed and that window repacked --repeats times by the tree's `repack` (the
first run is not measured: it fills numba's caches). Prints and writes (--json) the repack thread's CPU-seconds and the
process's (the block writer and I/O engine threads included) per window, the scan's and the
blocks' bytes, and checks every block file against the store's rows read with NumPy.

    python scripts/bench_repack_stage.py --store DIR [--baseline 5d12505 ...] [--repeats 3]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feed import FANOUTS, compared_trees, parse_or_run_child, store_arguments, tree_arguments  # noqa: E402


def child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["tree"]:
        sys.path.insert(0, spec["tree"])
    import numpy as np
    import torch

    from gnnssd import NodeLoader
    from gnnssd.storage_format import Store

    repack_module = importlib.import_module("gnnssd.pipeline.repack")  # (the package exports a function `repack`)
    repack = repack_module.repack
    window: list[tuple] = []

    def first_window(*args: Any) -> int:
        if not window and any(p.read.strategy.value == "block" for p in args[3]):
            window.append(args)
        return repack(*args)

    repack_module.repack = first_window
    store = Store.open(spec["store"])
    seeds = np.asarray(store.train_store_ids)
    with NodeLoader(store, store.original_ids(seeds), fanouts=FANOUTS, batch_size=spec["batch_size"], features="ssd",
                    shuffle=True, seed=spec["seed"], device=torch.device("cpu"), eval_fanouts=FANOUTS,
                    eval_batch_size=spec["batch_size"],
                    memory_budget=spec["budget"] or store.feature_bytes // 8) as loader:
        loader.set_epoch(1)
        batches = iter(loader)
        while not window and next(batches, None) is not None:
            pass
        batches.close()
        if not window:
            raise SystemExit(f"{spec['store']}: epoch 1 has no repack window with a compact block")
        args = list(window[0])
        plans, scan = args[3], args[4]
        thread_s, process_s = [], []
        with tempfile.TemporaryDirectory(dir=spec["scratch"]) as scratch:
            args[5] = Path(scratch)
            for run in range(spec["repeats"] + 1):
                start_thread, start_process = time.thread_time(), time.process_time()
                written = repack(*args)
                if run:  # the first fills numba's caches
                    thread_s.append(time.thread_time() - start_thread)
                    process_s.append(time.process_time() - start_process)
            blocks = [p for p in plans if p.read.strategy.value == "block"]
            rows = np.memmap(store.features_path, np.uint8, "r")
            for p in blocks:
                data = np.fromfile(Path(scratch) / p.read.block, np.uint8)
                want = rows[: (int(p.read_rows[-1]) + 1) * store.row_bytes].reshape(-1, store.row_bytes)[p.read_rows]
                n = want.size
                if not (np.array_equal(data[:n], want.reshape(-1)) and not data[n:].any() and len(data) % 4096 == 0):
                    raise SystemExit(f"{p.read.block}: not the store's rows {p.read_rows[:5]}... padded to a page")
    return {"tree": spec["label"], "plans": len(plans), "blocks": len(blocks), "scan_bytes": int(scan.lengths.sum()),
            "written_bytes": int(written), "thread_cpu_s": [round(s, 4) for s in thread_s],
            "process_cpu_s": [round(s, 4) for s in process_s], "blocks_equal_store_rows": True}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    store_arguments(p)
    p.add_argument("--repeats", type=int, default=3, help="measured repacks of the window per tree and round")
    p.add_argument("--rounds", type=int, default=2, help="every tree once per round, in turn")
    p.add_argument("--budget", help="the ssd loader's memory budget (default: 1/8 of the features)")
    tree_arguments(p, "bench_repack_stage")
    args = parse_or_run_child(p, child)
    if args is None:
        return 0
    trees = compared_trees(args)
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    rows: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for label, tree in trees:
            spec = {"store": str(args.store), "tree": tree, "label": label, "repeats": args.repeats,
                    "budget": args.budget, "batch_size": args.batch_size, "seed": args.seed,
                    "scratch": str(args.work.resolve())}
            out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                                 text=True, env=env)
            if out.returncode:
                raise SystemExit(f"{label}: its run failed (exit {out.returncode}; see its stderr above)")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            row = rows.setdefault(label, {**r, "thread_cpu_s": [], "process_cpu_s": []})
            row["thread_cpu_s"] += r["thread_cpu_s"]
            row["process_cpu_s"] += r["process_cpu_s"]
    print(f"window: {r['plans']} plans, {r['blocks']} blocks; scan {r['scan_bytes'] / 2**20:.0f} MiB, "
          f"blocks {r['written_bytes'] / 2**20:.0f} MiB; every tree's blocks equal the store's rows")
    print(f"{'tree':<16} {'repack thread CPU s (median; all)':<50} process CPU s (median)")
    for label, row in rows.items():
        row["thread_cpu_s_median"] = float(sorted(row["thread_cpu_s"])[len(row["thread_cpu_s"]) // 2])
        row["process_cpu_s_median"] = float(sorted(row["process_cpu_s"])[len(row["process_cpu_s"]) // 2])
        print(f"{label:<16} {row['thread_cpu_s_median']:.3f} {row['thread_cpu_s']!s:<44} "
              f"{row['process_cpu_s_median']:.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": list(rows.values()), "store": str(args.store)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
