#!/usr/bin/env python3
"""How much of a planted neighbourhood structure each node order recovers.

A synthetic graph with a `--local-fraction` of its edges inside neighbourhoods of
`--local-size` nodes (node IDs random: only an order can find them). For each order, the
share of edges whose two ends land in the same aligned window of `--window` rows of the
order (`gnnssd.sampler.order.window_locality`), over all edges and over the edges between
cold rows (neither end among the hottest 5%, which the hot cache holds whatever the order),
and the seconds the order took. `oracle` is the generator's own neighbourhood order.

    python scripts/bench_order.py [--nodes 200000] [--json bench_out/bench_order.json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from gnnssd.datasets import synthetic_source
from gnnssd.sampler.order import ORDERS, hotness, window_locality
from gnnssd.storage_format.preprocess.csc import csc_from_edges

FANOUTS = (15, 10, 5)


def planted_graph(nodes: int, local_fraction: float, local_size: int):
    """(indptr, indices, src, dst, oracle order) of the synthetic graph."""
    source = synthetic_source(num_nodes=nodes, feat_dim=4, avg_degree=15, num_classes=16,
                              local_fraction=local_fraction, local_size=local_size)
    src, dst = source.load_edges()
    indptr, indices = csc_from_edges(src, dst, nodes)
    return indptr, indices, src, dst, source.neighbourhood_order()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--local-fraction", type=float, default=0.8)
    p.add_argument("--local-size", type=int, default=1024)
    p.add_argument("--window", type=int, default=4096, help="rows per window (default: %(default)s)")
    p.add_argument("--orders", default="original,degree,locality,rcm,metis")
    p.add_argument("--json", type=Path, default=Path("bench_out/bench_order.json"))
    args = p.parse_args()
    indptr, indices, src, dst, oracle = planted_graph(args.nodes, args.local_fraction, args.local_size)
    heat = hotness(indptr, indices, FANOUTS)
    hot = np.zeros(args.nodes, bool)
    hot[np.argsort(-heat, kind="stable")[: args.nodes // 20]] = True
    cold = ~hot[src] & ~hot[dst]
    print(f"{args.nodes:,} nodes, {len(src):,} edges, {args.local_fraction:.0%} inside neighbourhoods of "
          f"{args.local_size}; window {args.window} rows; {cold.mean():.0%} of edges between cold rows")
    print(f"{'order':<10} {'all edges':>9} {'cold edges':>10} {'seconds':>8}")
    rows = []
    for name in ["oracle", *args.orders.split(",")]:
        start = time.perf_counter()
        perm = oracle if name == "oracle" else ORDERS[name].permutation(indptr, indices, None)
        seconds = time.perf_counter() - start
        row = {"order": name, "all_edges": round(window_locality(perm, src, dst, args.window), 3),
               "cold_edges": round(window_locality(perm, src[cold], dst[cold], args.window), 3),
               "seconds": round(seconds, 2)}
        rows.append(row)
        print(f"{name:<10} {row['all_edges']:>9.3f} {row['cold_edges']:>10.3f} {row['seconds']:>8.2f}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
