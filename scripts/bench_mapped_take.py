#!/usr/bin/env python3
"""A mini-batch's ID conversion through a node-sized mapped array (perm.npy), two ways side
by side: plain NumPy indexing of the mapping (its pages stay resident: the whole file, for
a random lookup of many IDs) and storage_format.mapped_take (window by window, pages
released). Per round, alternating: milliseconds per lookup and the mapping's resident
bytes after it (/proc/self/smaps).

    python scripts/bench_mapped_take.py --dir SCRATCH [--nodes 111000000] [--ids 755000]
        [--rounds 5] [--json bench_out/mapped_take.json]

The file (8 bytes a node) is written to --dir and removed at the end; its pages are in the
page cache for every round (the first lookup of each method is a warm-up, not timed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from gnnssd.storage_format import mapped_take, release_pages

from bench_memory_parts import mapped_files  # a sibling script (scripts/ is on the path)

MiB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--nodes", type=int, default=111_000_000)
    parser.add_argument("--ids", type=int, default=755_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    path = (Path(args.dir) / "perm.npy").resolve()
    chunk = 1 << 24
    with open(path, "wb") as f:  # written in chunks: no node-sized array in this process
        np.lib.format.write_array_header_1_0(f, {"descr": "<i8", "fortran_order": False, "shape": (args.nodes,)})
        for lo in range(0, args.nodes, chunk):
            f.write((args.nodes - 1 - np.arange(lo, min(lo + chunk, args.nodes), dtype=np.int64)).tobytes())
    try:
        perm = np.load(path, mmap_mode="r")
        rng = np.random.default_rng(0)
        methods = {"numpy indexing of the mapping": lambda ids: np.asarray(perm)[ids],
                   "mapped_take": lambda ids: mapped_take(perm, ids)}
        times: dict[str, list[float]] = {name: [] for name in methods}
        resident: dict[str, list[int]] = {name: [] for name in methods}
        for name, take in methods.items():  # warm-up: the page cache and the mapping
            take(rng.integers(0, args.nodes, args.ids))
        for _ in range(args.rounds):
            for name, take in methods.items():
                ids = rng.integers(0, args.nodes, args.ids)
                if name == "mapped_take":
                    release_pages(perm)  # what the other method left
                start = time.perf_counter()
                out = take(ids)
                times[name].append(time.perf_counter() - start)
                resident[name].append(mapped_files(path.parent).get("perm", 0))
                assert np.array_equal(out, args.nodes - 1 - ids)
        rows = {name: {"ms_median": 1000 * float(np.median(times[name])), "ms": [1000 * t for t in times[name]],
                       "resident_after_mib": max(resident[name]) / MiB} for name in methods}
        print(f"{args.nodes:,} nodes ({args.nodes * 8 / MiB:,.0f} MiB file), {args.ids:,} random IDs, "
              f"{args.rounds} alternating rounds")
        print("| method | ms per lookup (median) | mapping resident after (MiB) |\n|---|---|---|")
        for name, row in rows.items():
            print(f"| {name} | {row['ms_median']:.1f} | {row['resident_after_mib']:,.1f} |")
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"nodes": args.nodes, "ids": args.ids, "rows": rows}, indent=2))
    finally:
        path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
