#!/usr/bin/env python3
"""Data-parallel benchmark: `features: ssd` training on 1 and on 2 local ranks, in one run,
with the same total memory budget (each of 2 ranks gets half of `ssd.memory_budget`).

Each setting runs through gnnssd's launcher (torch's elastic agent, gloo ranks on
127.0.0.1), every rank in its own process: per rank, its mini-batches/s over a fixed
number of training mini-batches (forward, backward with DDP's gradient averaging, step)
and its peak RSS (ru_maxrss). The target for memory: the ranks' summed peak RSS within
budget + topology + ranks x 1.5 GiB (the topology is memory-mapped, so local ranks share
its pages; each rank pays for its own Python, torch and DGL). On a 2-core machine the
speed-up of 2 ranks is not the point; the memory is.

    python scripts/bench_distributed.py --store DIR [--budget SIZE] [--batches N] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import itertools
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch.nn.functional as F

from gnnssd.core.budget import format_bytes, parse_bytes
from gnnssd.core.config import config_from_dict
from gnnssd.storage_format import Store
from gnnssd.training import distributed
from gnnssd.training.tasks import Trainer

RANK_OVERHEAD = 1.5 * 2**30  # the target's allowance per rank (interpreter, torch, DGL)


def rank_run(config: dict, batches: int) -> dict:
    """One rank: `batches` training mini-batches of its shard; its rate and peak RSS."""
    trainer = Trainer(config_from_dict(config))
    trainer.model.train()
    trainer.loader.set_epoch(1)
    minibatches = iter(trainer.loader)  # this rank's shard of the epoch's seeds
    done, start = 0, time.perf_counter()
    try:
        for batch in itertools.islice(minibatches, batches):
            logits = trainer.train_model(batch.blocks, batch.x)
            loss = F.cross_entropy(logits, batch.y)
            trainer.optimizer.zero_grad()
            loss.backward()
            trainer.optimizer.step()
            done += 1
    finally:
        minibatches.close()
    seconds = time.perf_counter() - start
    trainer.close()
    return {"rank": trainer.ranks.rank, "batches": done, "seconds": round(seconds, 3),
            "batches_per_s": round(done / seconds, 3),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="a store (e.g. the synthetic medium preset)")
    parser.add_argument("--budget", default="1GiB", help="ssd.memory_budget: the machine's total")
    parser.add_argument("--batches", type=int, default=40, help="training mini-batches per rank")
    parser.add_argument("--quick", action="store_true", help="10 mini-batches per rank")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    batches = 10 if args.quick else args.batches
    store = Store.open(args.store)
    topology = store.indptr.nbytes + store.indices.nbytes
    budget = parse_bytes(args.budget)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_distributed_") as scratch:
        for nproc in (1, 2):
            config = {"store": str(Path(args.store).resolve()), "run_dir": f"{scratch}/run{nproc}",
                      "features": "ssd", "seed": 0,
                      "model": {"name": "sage", "hidden": 128, "layers": 2, "dropout": 0.5},
                      "sampler": {"fanouts": [10, 10], "batch_size": 1024, "eval_fanouts": [10, 10],
                                  "eval_batch_size": 1024},
                      "train": {"epochs": 1, "progress": False}, "ssd": {"memory_budget": args.budget}}
            results = distributed.launch(nproc, rank_run, config, batches)
            ranks = [results[r] for r in sorted(results)]
            summed = sum(r["peak_rss"] for r in ranks)
            rows.append({"ranks": nproc, "per_rank": ranks,
                         "batches_per_s": round(sum(r["batches_per_s"] for r in ranks), 3),
                         "peak_rss_sum": summed,
                         "rss_target": int(budget + topology + nproc * RANK_OVERHEAD)})
    print(f"store {args.store}: {store.num_nodes:,} nodes, topology {format_bytes(topology)}, "
          f"budget {format_bytes(budget)} in all, {batches} mini-batches of 1024 per rank")
    print(f"{'ranks':>5} {'mini-batches/s (all)':>21} {'per rank':>18} {'peak RSS per rank':>24} "
          f"{'summed':>10} {'target':>10}")
    for row in rows:
        per_rate = ", ".join(f"{r['batches_per_s']:.2f}" for r in row["per_rank"])
        per_rss = ", ".join(format_bytes(r["peak_rss"]) for r in row["per_rank"])
        print(f"{row['ranks']:>5} {row['batches_per_s']:>21.2f} {per_rate:>18} {per_rss:>24} "
              f"{format_bytes(row['peak_rss_sum']):>10} {format_bytes(row['rss_target']):>10}")
    if args.json:
        Path(args.json).write_text(json.dumps({"store": str(args.store), "budget": budget,
                                               "topology_bytes": topology, "batches_per_rank": batches,
                                               "rows": rows}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
