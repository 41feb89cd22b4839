#!/usr/bin/env python3
"""Layer-wise inference benchmark: `embed` with ssd features against memory-mode layer-wise
inference of the same model on the same store, in one run.

`memory`: features.bin loaded into RAM, each layer computed in chunks of destination nodes
over all their in-neighbours' rows, outputs in RAM (DGL's full-graph inference). `ssd`
(gnnssd.inference.layerwise.LayerwiseSSD): GraphSAGE-mean layers by sequential passes over the
layer's input file through the io_engine (O_DIRECT; gnnssd.inference.mean), each layer
written as a page-aligned scratch file with O_DIRECT and read back by the next layer. Same
model (a GraphSAGE with random weights, seeded), same store; "read" counts the bytes of
the extents read. Each mode runs in a fresh subprocess
so its peak RSS (ru_maxrss) is its own; the first rows of both outputs are compared.

    python scripts/bench_embed.py --store DIR [--budget SIZE | --budget-fraction F]
        [--hidden H] [--layers L] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gnnssd.core.budget import format_bytes, parse_bytes
from gnnssd.core.config import ModelConfig
from gnnssd.inference.layerwise import LayerwiseSSD, layerwise_memory
from gnnssd.models.builtin import build_model
from gnnssd.storage_format import Store

COMPARED_ROWS = 4096


def run_mode(mode: str, store_dir: Path, budget: int, hidden: int, layers: int, scratch: Path) -> dict:
    """One mode in this process: seconds, bytes read/written, peak RSS, first output rows."""
    store = Store.open(store_dir)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="sage", hidden=hidden, layers=layers, dropout=0.0),
                        store.feat_dim, hidden).eval()
    start = time.perf_counter()
    if mode == "memory":
        out = layerwise_memory(model, store, budget=budget)
        first = out[:COMPARED_ROWS].numpy()
        written = read = 0
    else:
        runner = LayerwiseSSD(store, scratch, budget)
        path, dim = runner.run(model)
        first = np.fromfile(path, np.float32, count=min(COMPARED_ROWS, store.num_nodes) * dim).reshape(-1, dim)
        read, written = runner.bytes_read, runner.bytes_written
        path.unlink()
        runner.close()
    seconds = time.perf_counter() - start
    np.save(scratch / f"{mode}_first.npy", first)
    return {"mode": mode, "seconds": round(seconds, 2), "bytes_read": read, "bytes_written": written,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, type=Path)
    parser.add_argument("--budget", help="memory budget of ssd mode (default: --budget-fraction)")
    parser.add_argument("--budget-fraction", type=float, default=0.12, help="of the feature bytes")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--scratch", type=Path, help="scratch directory (default: beside the store)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=["memory", "ssd"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    store = Store.open(args.store)
    budget = parse_bytes(args.budget) if args.budget else int(args.budget_fraction * store.feature_bytes)
    scratch = args.scratch or args.store.parent / f".{args.store.name}.embed-scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(run_mode(args.child, args.store, budget, args.hidden, args.layers, scratch)))
        return
    results = {}
    for mode in ("memory", "ssd"):
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", mode],
                               check=True, capture_output=True, text=True)
        results[mode] = json.loads(child.stdout.strip().splitlines()[-1])
    topology = (args.store / "indptr.npy").stat().st_size + (args.store / "indices.npy").stat().st_size
    limit = budget + topology + (3 << 29)
    diff = float(np.abs(np.load(scratch / "memory_first.npy") - np.load(scratch / "ssd_first.npy")).max())
    for mode in results:
        (scratch / f"{mode}_first.npy").unlink()
    scratch.rmdir()
    summary = {
        "store": store.manifest.get("name"), "nodes": store.num_nodes, "edges": store.num_edges,
        "feature_bytes": store.feature_bytes, "budget": budget, "topology_bytes": topology,
        "rss_limit": limit, "hidden": args.hidden, "layers": args.layers,
        "time_ratio_ssd_over_memory": round(results["ssd"]["seconds"] / results["memory"]["seconds"], 2),
        "ssd_rss_within_limit": results["ssd"]["peak_rss"] <= limit,
        "max_abs_diff_first_rows": diff, "runs": results,
    }
    print(f"{store.manifest.get('name')}: {store.num_nodes:,} nodes, {store.num_edges:,} edges, features "
          f"{format_bytes(store.feature_bytes)}, budget {format_bytes(budget)}, topology {format_bytes(topology)}")
    print(f"{'mode':8} {'seconds':>9} {'read':>11} {'written':>11} {'peak RSS':>11}")
    for r in results.values():
        print(f"{r['mode']:8} {r['seconds']:9.1f} {format_bytes(r['bytes_read']):>11} "
              f"{format_bytes(r['bytes_written']):>11} {format_bytes(r['peak_rss']):>11}")
    print(f"time ssd/memory {summary['time_ratio_ssd_over_memory']}x; ssd peak RSS "
          f"{format_bytes(results['ssd']['peak_rss'])} vs limit budget + topology + 1.5 GiB = "
          f"{format_bytes(limit)}; max |memory - ssd| over the first rows {diff:.2e}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
