#!/usr/bin/env python3
"""The ssd loader's planning stage alone, this tree beside baseline commits: CPU per mini-batch.

bench_feed times the whole loader, whose per-thread figures move by about ±10% between runs
on a shared machine; this measures one stage's work in one thread, where a change of a few
hundredths of a CPU-second per mini-batch shows. Per tree, in a fresh process: the same
seed batches planned with the loader's planner (a hot cache of the --hot-share most reached
rows, mega-batches of 16, buffers of --max-rows rows, so large mini-batches come in
pieces), every plan spilled as the loader spills it while it waits for its repack window
(a piece other than a mini-batch's last without its blocks) and restored as the read stage
restores it. Prints and writes (--json) CPU-seconds per mini-batch of each step (thread
time, numba on one thread), bytes spilled per mini-batch and the piece plans' gather-index
entries per mini-batch; the plans of every tree are compared (every plan's rows, carried
slots, gather indices, piece positions, input rows and stats, by a hash of their bytes).

    python scripts/bench_plan_stage.py --store DIR [--baseline 6b66535 ...] [--batches 32]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feed import FANOUTS, compared_trees, parse_or_run_child, store_arguments, tree_arguments  # noqa: E402


def child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["tree"]:
        sys.path.insert(0, spec["tree"])
    import numpy as np

    from gnnssd.pipeline import HotRanking
    from gnnssd.sampler import PlanConfig, Planner, Shuffled, seed_batches
    from gnnssd.storage_format import Store

    store = Store.open(spec["store"])
    batches = seed_batches(np.asarray(store.train_store_ids), spec["batch_size"], Shuffled(), spec["seed"], 1)
    batches = batches[: spec["batches"]]
    hot = HotRanking(store, FANOUTS).top(int(store.num_nodes * spec["hot_share"]))
    config = PlanConfig(fanouts=tuple(FANOUTS), mega_batch=16, seed=spec["seed"])
    seconds = {"plan": 0.0, "spill": 0.0, "restore": 0.0}
    spilled = index_entries = 0
    digest = []
    with tempfile.TemporaryDirectory(dir=spec["scratch"]) as scratch:
        for warm in (True, False):  # the first pass fills numba's caches
            planner = Planner(store.indptr, store.indices, config, hot, max_rows=spec["max_rows"])
            plans = planner.plan_batches(batches[:16] if warm else batches, 1)
            while True:
                start = time.thread_time()
                plan = next(plans, None)
                if not warm:
                    seconds["plan"] += time.thread_time() - start
                if plan is None:
                    break
                if warm:
                    continue
                if plan.pieces:
                    index_entries += len(plan.gather[0])
                start = time.thread_time()
                stub = plan if not plan.pieces or plan.piece == plan.pieces - 1 else replace(plan, minibatches=[])
                stub = stub.spill(Path(scratch) / f"p{plan.index}.spill")
                seconds["spill"] += time.thread_time() - start
                spilled += os.path.getsize(stub.spill_path)
                start = time.thread_time()
                full = stub.restore()
                seconds["restore"] += time.thread_time() - start
                content = hashlib.sha1()
                for a in [full.rows, full.carry_src, full.positions, *full.gather,
                          *(m.input_rows for m in full.minibatches)]:
                    content.update(np.ascontiguousarray(a, np.int64).tobytes())
                digest.append([int(full.index), int(full.piece), int(full.pieces), full.rows.tolist()[:50],
                               int(full.num_read), [m.input_rows.tolist()[:50] for m in full.minibatches],
                               json.dumps(full.stats, sort_keys=True), content.hexdigest()])
    n = len(batches)
    return {"tree": spec["label"], "minibatches": n,
            "cpu_s_per_minibatch": {k: round(v / n, 4) for k, v in seconds.items()},
            "total_cpu_s_per_minibatch": round(sum(seconds.values()) / n, 4),
            "spilled_bytes_per_minibatch": spilled // n, "piece_index_entries_per_minibatch": index_entries // n,
            "digest": digest}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    store_arguments(p)
    p.add_argument("--batches", type=int, default=32, help="mini-batches planned per tree")
    p.add_argument("--max-rows", type=int, default=100_000, help="rows per mega-batch buffer")
    p.add_argument("--hot-share", type=float, default=0.05, help="share of the rows in the hot cache")
    tree_arguments(p, "bench_plan_stage")
    args = parse_or_run_child(p, child)
    if args is None:
        return 0
    trees = compared_trees(args)
    rows = []
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    for label, tree in trees:
        spec = {"store": str(args.store), "tree": tree, "label": label, "batches": args.batches,
                "max_rows": args.max_rows, "batch_size": args.batch_size, "hot_share": args.hot_share, "seed": args.seed,
                "scratch": str(args.work.resolve())}
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                             text=True, env=env, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{label:<16} CPU s/mb {r['total_cpu_s_per_minibatch']:.4f} {r['cpu_s_per_minibatch']} "
              f"spilled {r['spilled_bytes_per_minibatch'] / 2**20:.1f} MiB/mb, piece index entries "
              f"{r['piece_index_entries_per_minibatch']:,}/mb", flush=True)
    same = all(r["digest"] == rows[0]["digest"] for r in rows)
    print("same plans (every array and stat) in every tree:", same)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": [{k: v for k, v in r.items() if k != "digest"} for r in rows],
                                     "same_plans": same, "store": str(args.store)}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
