#!/usr/bin/env python3
"""The planner's union of input rows at a graph size no store here has: this tree beside
baseline commits, CPU and memory held.

bench_plan_stage measures the planning stage on a real store; the union's costs grow with
the graph's rows (a slot map of a row each, walked in row order) or with the union (a hash
table), so at papers' 111M rows they differ from a small store's. Per tree, in a fresh
process (numba on one thread): groups of --minibatches mini-batches of --inputs distinct
rows each, drawn from a pool of --inputs * --minibatches / 2 rows (so mini-batches share
rows) of a --rows-row graph with 5% of the rows hot, added to a RowUnion and taken as a
plan, --groups times (the first, which compiles and grows, left out). Prints and writes
(--json) CPU-seconds per group for add and take, and the bytes the union holds between
groups (its arrays but the hot rows'); the plans of every tree are compared.

    python scripts/bench_row_union.py --rows 111000000 --inputs 576000 [--baseline 5d12505]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feed import compared_trees, parse_or_run_child, tree_arguments  # noqa: E402


def child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["tree"]:
        sys.path.insert(0, spec["tree"])
    import numpy as np

    from gnnssd.sampler.blocks import MFGs
    from gnnssd.sampler.plan import HotRows, RowUnion

    rng = np.random.default_rng(spec["seed"])
    rows, inputs, count = spec["rows"], spec["inputs"], spec["minibatches"]
    hot = HotRows.of(rng.choice(rows, rows // 20, replace=False), rows)
    union = RowUnion(rows, hot)
    seconds = {"add": 0.0, "take": 0.0}
    held = 0
    digest = hashlib.sha1()
    none = np.empty(0, np.int32)
    for group in range(spec["groups"]):
        pool = rng.choice(rows, inputs * count // 2, replace=False)
        batches = [MFGs(nodes=nodes, num_src=np.array([len(nodes)]), num_dst=np.array([0]),
                        edge_ptr=np.array([0, 0]), edge_src=none, edge_dst=none)
                   for nodes in (pool[rng.permutation(len(pool))[:inputs]] for _ in range(count))]
        start = time.thread_time()
        for mfgs in batches:
            union.add(mfgs, 1 << 62)
        added = time.thread_time()
        plan = union.take(None, 0, 0, group)
        taken = time.thread_time()
        if group:
            seconds["add"] += added - start
            seconds["take"] += taken - added
        for a in [plan.rows, *plan.gather]:
            digest.update(np.ascontiguousarray(a, np.int64).tobytes())
        held = max(held, sum(v.nbytes for k, v in vars(union).items() if isinstance(v, np.ndarray)))
        del plan, batches
    n = spec["groups"] - 1
    return {"tree": spec["label"], "cpu_s_per_group": {k: round(v / n, 4) for k, v in seconds.items()},
            "held_bytes": held, "digest": digest.hexdigest()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=111_000_000, help="rows of the graph")
    p.add_argument("--inputs", type=int, default=576_000, help="input rows per mini-batch")
    p.add_argument("--minibatches", type=int, default=4, help="mini-batches per group")
    p.add_argument("--groups", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    tree_arguments(p, "bench_row_union")
    args = parse_or_run_child(p, child)
    if args is None:
        return 0
    trees = compared_trees(args)
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    rows = []
    print(f"{args.rows:,} rows, groups of {args.minibatches} mini-batches of {args.inputs:,} input rows")
    print("| tree | add, CPU s/group | take, CPU s/group | held between groups, MiB |\n|---|---|---|---|")
    for label, tree in trees:
        spec = {"tree": tree, "label": label, "rows": args.rows, "inputs": args.inputs,
                "minibatches": args.minibatches, "groups": args.groups, "seed": args.seed}
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                             text=True, env=env, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"| {label} | {r['cpu_s_per_group']['add']:.4f} | {r['cpu_s_per_group']['take']:.4f} | "
              f"{r['held_bytes'] / 2**20:,.1f} |", flush=True)
    same = all(r["digest"] == rows[0]["digest"] for r in rows)
    print("same plans in every tree:", same)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                     "same_plans": same}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
