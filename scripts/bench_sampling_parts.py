#!/usr/bin/env python3
"""Where neighbour sampling's time goes, uniform beside LABOR: the hop kernel (drawing
each layer's in-edges) and the relabelling (dedup into block-local IDs), summed over
the layers of `--batches` mini-batches of 1,024 training seeds sampled together (as the
planner samples a mega-batch), fanouts 15,10,5. Methods alternate on the same seeds;
the first round (numba's loading) is left out; medians of the rest.

    python scripts/bench_sampling_parts.py --store STORE [--batches 4] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from gnnssd.sampler import sampling
from gnnssd.storage_format import Store

FANOUTS = (15, 10, 5)


def sample_parts(indptr: np.ndarray, indices: np.ndarray, seeds: list[np.ndarray], method: str) -> dict:
    """Seconds of the hop kernels and of the relabelling (as NeighborSampler.sample_many
    runs them, thread counts included), the input nodes and edges."""
    sampler = sampling.NeighborSampler(indptr, indices, list(FANOUTS), method=method)
    nodes = np.concatenate(seeds)
    node_ptr = np.r_[0, np.cumsum([len(s) for s in seeds])].astype(np.int64)
    ex_ptr, ex_keys = sampling.exclusion_keys(None, len(indptr) - 1, len(seeds))
    hop = relabel = 0.0
    edges = 0
    for layer in reversed(range(len(FANOUTS))):
        batch = np.repeat(np.arange(len(seeds), dtype=np.int64), np.diff(node_ptr))
        start = time.perf_counter()
        eptr, nbrs, _ = sampler._hop(nodes, batch, sampler.fanouts[layer], 1, layer, batch, ex_ptr, ex_keys)
        middle = time.perf_counter()
        node_ptr, nodes, _, _ = sampling.relabel_layer(nodes, node_ptr, eptr, nbrs, len(indptr) - 1)
        hop, relabel = hop + middle - start, relabel + time.perf_counter() - middle
        edges += len(nbrs)
    return {"hop_s": hop, "relabel_s": relabel, "input_nodes": len(nodes), "edges": edges}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--batches", type=int, default=4, help="mini-batches of 1,024 seeds sampled together")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per method (the first is left out)")
    args = parser.parse_args()
    store = Store.open(args.store)
    indptr = np.ascontiguousarray(store.indptr, np.int64)
    indices = np.ascontiguousarray(store.indices)
    train = np.asarray(store.train_store_ids)
    runs: dict[str, list[dict]] = {"uniform": [], "labor": []}
    for round_ in range(args.rounds):
        rng = np.random.default_rng(round_)
        seeds = [np.sort(rng.choice(train, min(1024, len(train)), replace=False)) for _ in range(args.batches)]
        for method in runs:
            parts = sample_parts(indptr, indices, seeds, method)
            if round_:
                runs[method].append(parts)
    for method, rows in runs.items():
        print(f"{method:8} hop {statistics.median(r['hop_s'] for r in rows):.3f} s  relabel "
              f"{statistics.median(r['relabel_s'] for r in rows):.3f} s  input nodes {rows[-1]['input_nodes']:,}  "
              f"edges {rows[-1]['edges']:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
