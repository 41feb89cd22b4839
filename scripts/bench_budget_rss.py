#!/usr/bin/env python3
"""What `ssd.memory_budget` does not cover, measured: the ssd loader's peak resident memory
beyond the budget while it iterates, in a fresh process per setting.

Each setting runs in its own subprocess: it imports torch, DGL and gnnssd (RSS `imported`),
runs the numba sampler and planner once on a tiny graph so their compiled code is loaded
(RSS `compiled`: numba's share, cached on disk after the first run), resets the peak
(VmHWM, /proc/self/clear_refs), then opens a NodeLoader (`features: ssd`, the budget,
`mega_batch` mini-batches planned ahead) over `--batches` training mini-batches of the store
and iterates them. `peak_above_compiled` = VmHWM - compiled RSS: what the loader held at
most; `beyond_budget` = that minus the budget. Mini-batches of 1024 seeds, fanouts 15,10,5.

    python scripts/bench_budget_rss.py --store STORE [--budgets 16MiB,64MiB] [--mega-batches 16,4]
        [--batches 40] [--json bench_out/budget_rss.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
import numpy as np

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

store_path, budget, mega_batch, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import torch, dgl, gnnssd
from gnnssd import NodeLoader, Store
imported = status("VmRSS:")
from gnnssd.sampler import PlanConfig, Planner
from gnnssd.sampler.graphs import random_csc
indptr, indices = random_csc(1000, 10000, seed=0)
list(Planner(indptr, indices, PlanConfig(fanouts=(3, 3), mega_batch=2)).plan_batches([np.arange(10)], 0))
compiled = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
store = Store.open(store_path)
seeds = np.random.default_rng(0).permutation(np.asarray(store.train_idx))[:batches * 1024]
with NodeLoader(store, seeds, fanouts=[15, 10, 5], batch_size=1024, features="ssd", memory_budget=budget,
                mega_batch=mega_batch, seed=0, device="cpu") as loader:
    for mb in loader:
        mb.x.sum()
print(json.dumps({"imported": imported, "compiled": compiled, "peak": status("VmHWM:")}))
"""


def parse_bytes(text: str) -> int:
    from gnnssd.core.budget import parse_bytes as parse

    return parse(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, type=Path)
    parser.add_argument("--budgets", default="16MiB,64MiB")
    parser.add_argument("--mega-batches", default="16,4")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--json", type=Path, default=Path("bench_out/budget_rss.json"))
    args = parser.parse_args()
    rows = []
    print(f"{'budget':>8} {'mega':>5} {'imported':>9} {'numba':>7} {'peak-compiled':>14} {'beyond budget':>14}  (MiB)")
    for budget in args.budgets.split(","):
        for mega in (int(m) for m in args.mega_batches.split(",")):
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.store), budget, str(mega), str(args.batches)],
                                 capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"budget {budget}, mega_batch {mega}: the child failed:\n{out.stderr[-3000:]}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            above = got["peak"] - got["compiled"]
            row = {"budget": budget, "mega_batch": mega, "imported_rss": got["imported"],
                   "numba_rss": got["compiled"] - got["imported"], "peak_above_compiled": above,
                   "beyond_budget": above - parse_bytes(budget)}
            rows.append(row)
            mib = 1 << 20
            print(f"{budget:>8} {mega:5d} {got['imported'] / mib:9.0f} {row['numba_rss'] / mib:7.0f} "
                  f"{above / mib:14.0f} {row['beyond_budget'] / mib:14.0f}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"store": args.store.name, "batches": args.batches, "rows": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
