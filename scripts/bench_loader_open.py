#!/usr/bin/env python3
"""What opening a loader costs, by part: a fresh loader in a new process, a loader on a
store that is already open (alone, and beside a live loader of that store), a loader on a
FeatureSource that is already open (GraphBolt's examples open a loader per evaluation),
and the first mini-batch after each.

Each `--features` mode runs in its own fresh interpreter (numba's cached kernels and DGL's
first calls count, as they do for a user). The parts are the loader's own steps, timed by
wrapping the functions that do them (hot ranking, sampling the x arrays' sizing
mini-batches, the budget split, the I/O engine and its threads, the hot cache's read,
the buffers, the scratch directory, ...); a part's time includes the parts it calls,
and a part that runs lazily (on the first iteration) shows up under the first mini-batch.

    python scripts/bench_loader_open.py --store STORE [--features ssd,memory] [--repeats 5]
                                        [--json bench_out/loader_open.json]
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

#: (label, module, attribute path): the steps of opening a loader, wrapped to time them.
PARTS = (
    ("store open", "gnnssd.storage_format", "Store.open"),
    ("scratch directory", "gnnssd.loading.feature_source", "private_scratch"),
    ("memory-mode topology", "gnnssd.loading.backends.memory", "store_topology"),
    ("memory-mode features", "gnnssd.loading.backends.memory", "load_features"),
    ("hot ranking", "gnnssd.pipeline.hot_cache", "HotRanking._order"),
    ("x sizing (sampled mini-batches)", "gnnssd.loading.backends.ssd", "SSDLoader._sampled_inputs"),
    ("budget split", "gnnssd.loading.backends.ssd", "ssd_split"),
    ("cost model", "gnnssd.loading.backends.ssd", "load_cost_model"),
    ("block budget", "gnnssd.loading.backends.ssd", "resolve_block_budget"),
    ("I/O engine + threads", "gnnssd.loading.backends.ssd", "DirectIO"),
    ("feature file", "gnnssd.loading.backends.ssd", "FeatureFile"),
    ("hot cache read", "gnnssd.loading.backends.ssd", "HotCache"),
    ("buffers", "gnnssd.loading.backends.ssd", "MegaBatchBuffers"),
)


class PartTimer:
    """Seconds per part, summed over the calls made since the last `take`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, label: str, module: str, attribute: str) -> None:
        """Replace module.attribute (a function, class, method or cached_property) with a
        timed twin; a name the module no longer has is skipped."""
        import importlib

        owner: Any = importlib.import_module(module)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        original = None if owner is None else owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if original is None:
            return
        if isinstance(original, functools.cached_property):
            original.func = self._timed(label, original.func)
            return
        if isinstance(original, (classmethod, staticmethod)):
            setattr(owner, name, type(original)(self._timed(label, original.__func__)))
            return
        setattr(owner, name, self._timed(label, original))

    def _timed(self, label: str, function: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
        return timed

    def take(self) -> dict[str, float]:
        parts, self.seconds = dict(self.seconds), defaultdict(float)
        return parts


def child(store_path: str, features: str, repeats: int, budget: str) -> dict:
    """The measurements of one mode in this (fresh) interpreter."""
    start = time.perf_counter()
    import gnnssd
    from gnnssd import EdgeLoader, FeatureSource, NodeLoader, Store

    imported = time.perf_counter() - start
    timer = PartTimer()
    for label, module, attribute in PARTS:
        timer.wrap(label, module, attribute)
    options = dict(fanouts=[10, 10], batch_size=35, features=features, memory_budget=budget, device="cpu", seed=0)
    out: dict[str, Any] = {"features": features, "import_s": imported, "gnnssd": gnnssd.__version__}

    def measured(make: Callable[[], Any]) -> dict:
        timer.take()
        start = time.perf_counter()
        loader = make()
        opened = time.perf_counter() - start
        parts = timer.take()
        start = time.perf_counter()
        next(iter(loader))
        first = time.perf_counter() - start
        first_parts = timer.take()
        loader.close()
        return {"open_s": opened, "parts": parts, "first_minibatch_s": first, "first_minibatch_parts": first_parts}

    start = time.perf_counter()
    store = Store.open(store_path)
    out["store_open_s"] = time.perf_counter() - start
    timer.take()
    out["fresh_loader"] = measured(lambda: NodeLoader(store, store.train_idx, **options))
    out["on_open_store"] = [measured(lambda: NodeLoader(store, store.train_idx, **options)) for _ in range(repeats)]
    with NodeLoader(store, store.train_idx, **options):  # a training loader alive: GraphBolt's evaluation pattern
        out["beside_a_live_loader"] = [measured(lambda: NodeLoader(store, store.valid_idx, **options))
                                       for _ in range(repeats)]
    source_options = {k: v for k, v in options.items() if k not in ("fanouts", "batch_size")}
    with FeatureSource.from_options(store, fanouts=options["fanouts"], batch_size=options["batch_size"],
                                    **source_options) as source:
        out["on_open_source"] = [measured(lambda: NodeLoader(source, store.valid_idx, fanouts=[10, 10], batch_size=35))
                                 for _ in range(repeats)]
        if source.backend.EDGE_BATCHES:
            edges = (store.indices[:64].astype("int64"), _destinations(store, 64))
            out["edge_loader_on_open_source"] = [
                measured(lambda: EdgeLoader(source, _original_edges(store, edges), fanouts=[10, 10], batch_size=32))
                for _ in range(repeats)]
    return out


def _destinations(store: Any, count: int) -> Any:
    """The destination of each of the first `count` edges (CSC: the column of each position)."""
    import numpy as np

    return np.searchsorted(np.asarray(store.indptr), np.arange(count), side="right") - 1


def _original_edges(store: Any, edges: tuple) -> tuple:
    """Store-ID edges in the dataset's IDs, as EdgeLoader takes them."""
    import numpy as np

    perm = np.asarray(store.perm)
    return perm[edges[0]], perm[edges[1]]


def summary(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def print_mode(result: dict) -> None:
    fresh = result["fresh_loader"]
    print(f"\n== features: {result['features']}  (import gnnssd {result['import_s']:.2f} s, "
          f"Store.open {result['store_open_s']:.3f} s)")
    warm = result["on_open_store"]
    print(f"{'':34} {'fresh':>9} {'open store':>11}")
    print(f"{'loader open (total)':34} {fresh['open_s']:9.3f} {summary(warm, 'open_s'):11.3f}")
    labels = [label for label, _, _ in PARTS]
    for label in labels:
        warm_part = statistics.median(run["parts"].get(label, 0.0) for run in warm)
        if label in fresh["parts"] or warm_part:
            print(f"  {label:32} {fresh['parts'].get(label, 0.0):9.3f} {warm_part:11.3f}")
    print(f"{'first mini-batch':34} {fresh['first_minibatch_s']:9.3f} {summary(warm, 'first_minibatch_s'):11.3f}")
    for label, seconds in fresh["first_minibatch_parts"].items():
        print(f"  {label:32} {seconds:9.3f}")
    for key in ("beside_a_live_loader", "on_open_source", "edge_loader_on_open_source"):
        if key in result:
            runs = result[key]
            print(f"{key.replace('_', ' '):34} open {summary(runs, 'open_s'):.4f} s (median of {len(runs)}), "
                  f"first mini-batch {summary(runs, 'first_minibatch_s'):.3f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="a store's directory (e.g. CiteSeer preprocessed)")
    parser.add_argument("--features", default="ssd,memory")
    parser.add_argument("--repeats", type=int, default=5, help="loaders opened per warm measurement")
    parser.add_argument("--budget", default="32MiB", help="ssd.memory_budget")
    parser.add_argument("--json", type=Path, default=Path("bench_out/loader_open.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.store, args.child, args.repeats, args.budget)))
        return 0
    results = []
    for features in args.features.split(","):
        done = subprocess.run([sys.executable, __file__, "--store", args.store, "--child", features,
                               "--repeats", str(args.repeats), "--budget", args.budget],
                              check=True, capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print_mode(results[-1])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "modes": results}, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
