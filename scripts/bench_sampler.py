"""Sampling throughput: gnnssd's numba sampler against DGL's NeighborSampler, same graph.

Both sample the blocks of the same mini-batches (fanouts 15,10,5, batch size 1024 by
default) with all cores. Rows: DGL's `NeighborSampler.sample` per mini-batch; ours per
mini-batch; ours per mega-batch of 8 mini-batches (how the planner calls it); ours per
mini-batch including conversion to DGLBlocks (what a trainer consumes).

    uv run python scripts/bench_sampler.py [--store DIR] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("DGLBACKEND", "pytorch")

import dgl
import numpy as np
import torch

from gnnssd.sampler.blocks import to_dgl_blocks
from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.sampling import NeighborSampler


def load_graph(args) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    if args.store:
        from gnnssd.storage_format import Store

        s = Store.open(args.store)
        return np.asarray(s.indptr), np.asarray(s.indices), np.asarray(s.train_store_ids), f"store {args.store}"
    n = args.nodes or (200_000 if args.quick else 2_000_000)
    indptr, indices = random_csc(n, 15, seed=0, communities=64)
    train = np.random.default_rng(0).choice(n, n // 10, replace=False)
    return indptr, indices, train, f"random power-law graph, {n} nodes"


def timed(fn, batches: list[np.ndarray], repeats: int) -> float:
    fn(batches[:2])  # warm-up (DGL's first call allocates; numba loads its cache)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(batches)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", help="store directory (default: a generated graph)")
    parser.add_argument("--nodes", type=int, help="size of the generated graph")
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, help="mini-batches timed (default 32, quick 16)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write {'rows': [...]} here")
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    indptr, indices, train, graph_name = load_graph(args)
    n = len(indptr) - 1
    num_batches = args.batches or (16 if args.quick else 32)
    perm = np.random.default_rng(1).permutation(train)
    batches = [perm[i * args.batch_size : (i + 1) * args.batch_size] for i in range(num_batches)]
    batches = [b for b in batches if len(b)]

    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    g = dgl.graph((torch.from_numpy(indices.astype(np.int64)), torch.from_numpy(dst)), num_nodes=n)
    del dst
    dgl_sampler = dgl.dataloading.NeighborSampler(fanouts)
    ours = NeighborSampler(indptr, indices, fanouts)

    def run_dgl(bs):
        for b in bs:
            dgl_sampler.sample(g, torch.from_numpy(b))

    def run_ours(bs):
        for i, b in enumerate(bs):
            ours.sample(b, seed=0, batch_id=i)

    def run_ours_mega(bs, m=8):
        for i in range(0, len(bs), m):
            group = bs[i : i + m]
            ours.sample_many(np.concatenate(group), np.concatenate([[0], np.cumsum([len(b) for b in group])]), 0, i)

    def run_ours_blocks(bs):
        for i, b in enumerate(bs):
            to_dgl_blocks(ours.sample(b, seed=0, batch_id=i))

    repeats = 2 if args.quick else 3
    results = [("dgl NeighborSampler", timed(run_dgl, batches, repeats))]
    results += [
        ("gnnssd per mini-batch", timed(run_ours, batches, repeats)),
        ("gnnssd per mega-batch of 8", timed(run_ours_mega, batches, repeats)),
        ("gnnssd per mini-batch + to_dgl_blocks", timed(run_ours_blocks, batches, repeats)),
    ]
    dgl_s = results[0][1]
    rows = [
        {
            "sampler": name,
            "graph": graph_name,
            "num_nodes": n,
            "num_edges": int(len(indices)),
            "fanouts": fanouts,
            "batch_size": args.batch_size,
            "minibatches": len(batches),
            "time_s": t,
            "minibatches_per_s": len(batches) / t,
            "speedup_vs_dgl": dgl_s / t,
        }
        for name, t in results
    ]
    print(f"{graph_name}, {len(indices)} edges; fanouts {fanouts}, batch {args.batch_size}, "
          f"{len(batches)} mini-batches, threads: torch {torch.get_num_threads()}, numba {os.environ.get('NUMBA_NUM_THREADS', 'all')}")
    print(f"{'sampler':40s} {'time_s':>8s} {'batches/s':>10s} {'vs DGL':>7s}")
    for r in rows:
        print(f"{r['sampler']:40s} {r['time_s']:8.3f} {r['minibatches_per_s']:10.1f} {r['speedup_vs_dgl']:6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
