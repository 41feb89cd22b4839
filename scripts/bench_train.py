#!/usr/bin/env python3
"""Training-loop benchmark: four ways to feed the same GNN from the same store, in one run.

Systems: `memory` (features in RAM, DGL's sampler: the reference, unlimited memory),
`mmap` (DGL's sampler, features indexed out of a NumPy memmap: what most users do),
`per-row` (DGL's sampler, each row missing from an LRU cache of the budget read as its own
O_DIRECT page through the io_engine: the Ginex / GraphBolt way) and `gnnssd` (`features:
ssd`), all through `gnnssd.NodeLoader` (`features=`). Same store, model (3-layer GraphSAGE, hidden 256, fanouts
15,10,5, batch 1024), seed and number of mini-batches for every system. Regimes:
`end-to-end` (forward, backward and step per mini-batch) and `loader-only` (the inputs
materialised and touched, no model: the regime of a fast GPU). gnnssd runs with the default
`ssd.block_budget` (auto, or --block-budget) and, as `gnnssd-extents`, with block_budget 0.
With --cores, memory and gnnssd also run loader-only pinned to the first N cores (one row
per N: how each scales with cores).

Rows of the disk loaders (per-row, gnnssd) carry `useful_bytes`, the bytes of the cold rows
their mini-batches needed (each mini-batch's distinct input rows outside the loader's cache,
from its io_stats, counted when the rows are loaded), and `read_amplification` = bytes_read /
useful_bytes. gnnssd loads up to two plans ahead of the loop: both counts include them.

Each (system, regime) runs in a fresh subprocess, so peak RSS (ru_maxrss) is its own;
bytes read are /proc/self/io read_bytes over the mini-batch loop (reads that reached
storage, i.e. missed the page cache); setup (building the graph, loading features for
`memory`) is measured apart. Before each run the page cache is dropped (as root). With
--limit-page-cache, runs other than `memory` happen beside a helper process that holds
all of MemAvailable but budget + headroom (mlocked if permitted, else touched), with
oom_score_adj 1000 so the kernel kills it first; it is stopped after each run. Do not use
that flag on a machine others are using: it takes their memory.

DGL's sampler draws neighbours racily with several threads, so the systems get the same
seed nodes per mini-batch but not bit-identical neighbour draws (statistically alike).

    python scripts/bench_train.py [--quick] [--json PATH] [--store DIR | --work DIR]
        [--budget SIZE] [--beside-x] [--batches N] [--limit-page-cache] [--systems ...] [--regimes ...]
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import mmap
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from gnnssd import NodeLoader
from gnnssd.core.budget import format_bytes, parse_bytes
from gnnssd.core.config import ModelConfig
from gnnssd.core.runtime import seed_everything
from gnnssd.core.timing import StageTimer
from gnnssd.datasets import synthetic_source
from gnnssd.loading.types import MiniBatch
from gnnssd.models.builtin import store_model
from gnnssd.sampler import ORDERS, named_order, node_order, seed_batches
from gnnssd.storage_format import Store, write_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feed import budget_beside_x  # noqa: E402  (a sibling script)

FEATURES = {"memory": "memory", "mmap": "mmap", "per-row": "per-row", "gnnssd": "ssd"}  # system -> loader
SYSTEMS = tuple(FEATURES)
# on request (--systems): gnnssd without page checksums, to measure what they cost
NO_VERIFY = "gnnssd-no-verify"
EXTENTS = "gnnssd-extents"  # gnnssd with block_budget 0, beside the default config
REUSE = "gnnssd-reuse"  # gnnssd with sampler.reuse_epochs --reuse-epochs (lever 4)
PINNED = ("memory", "gnnssd")  # the systems --cores runs loader-only on 1..N cores
REGIMES = ("end-to-end", "loader-only")
MODEL = ModelConfig(name="sage", hidden=256, layers=3, dropout=0.5, compile=False)  # dgl.nn SAGEConv
FANOUTS = [15, 10, 5]
BATCH_SIZE = 1024
LR = 0.003
GiB = 1 << 30
RUNTIME_ALLOWANCE = int(1.5 * GiB)  # beyond budget + topology, in the RSS target

#: On a heterogeneous store every relation takes the fanout (MAG-like: ~35 relation
#: neighbours a paper per layer), so two layers, as the MAG240M baselines sample.
TYPED_FANOUTS = [10, 5]


def model_for(store: Store) -> ModelConfig:
    """MODEL; on a heterogeneous store R-GCN (SAGE per relation), hidden 128, two layers."""
    return MODEL if store.schema.is_homogeneous else replace(MODEL, name="rgcn", hidden=128, layers=2)


def fanouts_for(store: Store) -> list[int]:
    return FANOUTS if store.schema.is_homogeneous else TYPED_FANOUTS


CPU = torch.device("cpu")


@dataclass
class Measured:
    """What one system did over the mini-batch loop."""
    seconds: float
    batches: int
    bytes_read: int
    stages_s: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)
    asked: int = 0  # mini-batches the run was to do (fewer: stopped by the time limit)


# --- the shared loop ---------------------------------------------------------------------

def storage_bytes_read() -> int:
    """Bytes this process has caused to be read from storage (past the page cache)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes line")


def mini_batches(loader: NodeLoader, n: int, first_epoch: int = 1) -> Iterator[MiniBatch]:
    """The first n training mini-batches from `first_epoch` on, epoch after epoch (shuffled)."""
    for epoch in itertools.count(first_epoch):
        loader.set_epoch(epoch)
        for batch in loader:
            yield batch
            n -= 1
            if n == 0:
                return


def whole_epochs(loader: NodeLoader, first: int, count: int) -> Iterator[MiniBatch]:
    """Every mini-batch of `count` epochs from `first`, each iterated to its end (what lets
    an epoch of reused samples be kept for the next)."""
    for epoch in range(first, first + count):
        loader.set_epoch(epoch)
        yield from loader


def make_step(regime: str, store: Store) -> Callable[[MiniBatch], None]:
    """What each mini-batch is for: a training step (end-to-end) or touching x."""
    if regime == "loader-only":
        return lambda batch: sum(float(x.sum()) for x in (batch.x.values() if isinstance(batch.x, dict) else [batch.x]))
    model = store_model(model_for(store), store, store.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    def train(batch: MiniBatch) -> None:
        loss = F.cross_entropy(model(batch.blocks, batch.x), batch.y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return train


def consume(batches: Iterator[MiniBatch], step: Callable[[MiniBatch], None],
            timer: StageTimer, time_limit: float) -> Measured:
    """Run `step` on every batch, or until `time_limit` seconds have passed; wall time,
    storage reads and the stage breakdown (the loader's stages plus "compute")."""
    timer.take()
    read0, start, n = storage_bytes_read(), time.perf_counter(), 0
    for batch in batches:
        with timer.stage("compute"):
            step(batch)
        n += 1
        if time.perf_counter() - start > time_limit:
            break
    return Measured(time.perf_counter() - start, n, storage_bytes_read() - read0, timer.take())


def run_system(system: str, store: Store, budget: int, batches: int, regime: str, block_budget: int | str,
               mega_batch: int, seed: int, time_limit: float, verify: bool = True,
               seed_order: str = "random", seed_window: int = 16384, reuse_epochs: int = 1,
               beside_x: bool = False) -> Measured:
    """One system through NodeLoader (`features=system`) within `budget` bytes: the
    per-row cache, or gnnssd's hot cache and buffers (compact blocks within `block_budget`
    bytes of disk, every page read checked against its checksum unless verify=False);
    `memory` holds all the features whatever the budget. With `beside_x`, a loader that
    counts the x arrays it hands out in its budget gets them on top of `budget`.

    With reuse_epochs K > 1 the epoch is the seeds of the first `batches` mini-batches and
    the run trains K epochs on its samples: `batches` x K mini-batches, the first epoch and
    the K - 1 replayed ones also timed apart."""
    seeds = np.asarray(store.train_store_ids)  # the seed order works in store IDs, as the loader's
    if reuse_epochs > 1:
        seeds = np.concatenate(seed_batches(seeds, BATCH_SIZE, named_order(seed_order, seed_window), seed, 1)[:batches])
    def opened(total: int) -> NodeLoader:
        return NodeLoader(store, store.original_ids(seeds), fanouts=fanouts_for(store), batch_size=BATCH_SIZE,
                          features=system, memory_budget=total, shuffle=True, seed=seed, device=CPU,
                          block_budget=block_budget, mega_batch=mega_batch, eval_fanouts=fanouts_for(store),
                          eval_batch_size=BATCH_SIZE, verify_checksums=verify, seed_order=seed_order,
                          seed_window=seed_window, reuse_epochs=reuse_epochs, first_epoch=1)

    if beside_x and system != "memory":
        budget = budget_beside_x(budget, opened)
    with opened(budget) as loader:
        setup_io = loader.io_stats()
        step = make_step(regime, store)
        first = whole_epochs(loader, 1, 1) if reuse_epochs > 1 else mini_batches(loader, batches)
        measured = consume(first, step, loader.timer, time_limit)
        measured.extra = {"loader_io": loader.io_stats(), "setup_io": setup_io, "memory_budget": budget}
        measured.asked = len(loader) * reuse_epochs if reuse_epochs > 1 else batches
        if reuse_epochs > 1:
            replayed = consume(whole_epochs(loader, 2, reuse_epochs - 1), step, loader.timer, time_limit)
            replay_io = loader.io_stats()
            measured.extra.update(
                reuse_epochs=reuse_epochs, first_epoch_s=round(measured.seconds, 3),
                replay_s=round(replayed.seconds, 3), replay_bytes_read=replayed.bytes_read,
                loader_io={k: v + replay_io.get(k, 0) for k, v in measured.extra["loader_io"].items()})
            measured.seconds += replayed.seconds
            measured.batches += replayed.batches
            measured.bytes_read += replayed.bytes_read
            measured.stages_s = {k: measured.stages_s.get(k, 0.0) + replayed.stages_s.get(k, 0.0)
                                 for k in {**measured.stages_s, **replayed.stages_s}}
    return measured


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One (system, regime) in this fresh process; returns its row."""
    start, read0 = time.perf_counter(), storage_bytes_read()
    store = Store.open(spec["store"])
    block_budget = 0 if spec["system"] == EXTENTS else spec["block_budget"]
    reuse_epochs = spec["reuse_epochs"] if spec["system"] == REUSE else 1
    seed_everything(spec["seed"])
    system, regime = spec["system"], spec["regime"]
    row: dict[str, Any] = {"system": system, "regime": regime, "cores": spec["cores"]}
    try:
        measured = run_system(FEATURES.get(system, "ssd"), store, spec["budget"], spec["batches"], regime,
                              block_budget, spec["mega_batch"], spec["seed"], spec["time_limit"],
                              verify=system != NO_VERIFY, seed_order=spec["seed_order"],
                              seed_window=spec["seed_window"], reuse_epochs=reuse_epochs,
                              beside_x=spec.get("beside_x", False))
    except NotImplementedError as exc:
        return {**row, "status": f"not run: {exc}"}
    total_s = time.perf_counter() - start
    return {**row, "status": "ok", "batches": measured.batches,
            "stopped_by_time_limit": measured.batches < measured.asked,
            "seconds": round(measured.seconds, 3),
            "batches_per_s": round(measured.batches / measured.seconds, 3),
            "bytes_read": measured.bytes_read,
            "setup_bytes_read": storage_bytes_read() - read0 - measured.bytes_read,
            "setup_s": round(total_s - measured.seconds, 3),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "stages_s": measured.stages_s, **measured.extra, **amplification(measured)}


def amplification(measured: Measured) -> dict[str, Any]:
    """useful_bytes and bytes_read / useful_bytes, for loaders that count useful bytes."""
    useful = measured.extra["loader_io"].get("useful_bytes", 0)
    if not useful:
        return {}
    return {"useful_bytes": useful, "read_amplification": round(measured.bytes_read / useful, 3)}


# --- the page cache ----------------------------------------------------------------------

def drop_caches() -> str:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except OSError as exc:
        return f"not dropped ({exc.strerror}: needs root)"


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def hold_memory(keep_free: int) -> None:
    """The page-cache limiter (runs as `--hold BYTES`): take all of MemAvailable but
    keep_free as anonymous memory (mlock, else touch every page), be the OOM killer's
    first choice, and keep it until the parent closes stdin. Measured here, after this
    process's own imports, so that they come out of the held part."""
    Path("/proc/self/oom_score_adj").write_text("1000\n")
    nbytes = max(mmap.PAGESIZE, mem_available() - keep_free)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    locked = libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(nbytes)) == 0
    if not locked:
        np.frombuffer(buf, dtype=np.uint8)[::mmap.PAGESIZE] = 1
    print(json.dumps({"held": nbytes, "locked": locked}), flush=True)
    sys.stdin.read()


class PageCacheLimit:
    """A running hold_memory helper for the duration of a with-block."""

    def __init__(self, keep_free: int):
        self.proc = subprocess.Popen([sys.executable, __file__, "--hold", str(keep_free)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise RuntimeError(f"the page-cache limiter exited ({self.proc.wait()}) before "
                               f"holding all but {format_bytes(keep_free)}")
        held = json.loads(line)
        self.held, self.locked = held["held"], held["locked"]

    def describe(self) -> str:
        how = "mlocked" if self.locked else "touched (mlock refused)"
        return f"limited: helper held {format_bytes(self.held)} ({how})"

    def __enter__(self) -> PageCacheLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.killed = self.proc.poll() is not None  # only the OOM killer ends it early
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- the harness -------------------------------------------------------------------------

def topology_bytes(store: Store) -> int:
    """The CSC as DGL holds it (int64 indptr and indices)."""
    return (store.num_nodes + 1 + store.num_edges) * 8


def open_or_make_store(args: argparse.Namespace) -> Store:
    if args.store:
        return Store.open(args.store)
    path = args.work / f"synthetic-{args.preset}-{args.order}"
    if not (path / "manifest.json").exists():
        print(f"writing the {args.preset} synthetic store to {path} (order {args.order})",
              flush=True)
        write_store(path, synthetic_source(args.preset), order=node_order(args.order))
    return Store.open(path)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One row in a fresh process; with spec["cores"], pinned (as taskset would) from its
    start to the first that many cores, so torch, numba and the I/O threads size to them."""
    cores = spec["cores"]
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, range(cores)))
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          stdout=subprocess.PIPE, text=True, preexec_fn=pin)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"system": spec["system"], "regime": spec["regime"], "cores": cores,
                "status": f"failed (exit {proc.returncode}; see stderr above)"}
    return json.loads(lines[-1])


def runs(args: argparse.Namespace) -> list[tuple[str, str, int | None]]:
    """(system, regime, cores or None) of every row, in order: each regime's systems, then
    the pinned loader-only rows of --cores."""
    pinned = [(system, "loader-only", cores) for cores in args.cores for system in PINNED
              if system in args.systems]
    return [(system, regime, None) for regime in args.regimes for system in args.systems] + pinned


def bench(args: argparse.Namespace, store: Store, budget: int) -> list[dict[str, Any]]:
    rows = []
    keep_free = budget + args.headroom
    for system, regime, cores in runs(args):
        caches = drop_caches()
        spec = {"system": system, "regime": regime, "store": str(store.path),
                "budget": budget, "batches": args.batches, "seed": args.seed,
                "block_budget": args.block_budget, "mega_batch": args.mega_batch,
                "time_limit": args.time_limit, "cores": cores, "seed_order": args.seed_order,
                "seed_window": args.seed_window, "reuse_epochs": args.reuse_epochs, "beside_x": args.beside_x}
        if args.limit_page_cache and system != "memory":
            with PageCacheLimit(keep_free) as limit:
                row = run_one(spec)
            page_cache = limit.describe() + (" -- killed by the OOM killer during the run"
                                             if limit.killed else "")
        else:
            row = run_one(spec)
            page_cache = "not limited"
        row.update(page_cache=page_cache, page_cache_dropped=caches)
        rows.append(row)
        print(_fmt(row), flush=True)
    for row in rows:
        reference = next((r for r in rows if r["system"] == "memory" and r["regime"] == row["regime"]
                          and r.get("cores") == row.get("cores") and r["status"] == "ok"), None)
        if row["status"] == "ok" and reference is not None:
            # per mini-batch: a run stopped by the time limit did fewer
            row["ratio_to_memory"] = round(reference["batches_per_s"] / row["batches_per_s"], 3)
    return rows


def targets(rows: list[dict[str, Any]], budget: int, store: Store) -> list[dict[str, Any]]:
    """The issue's targets, each with its measured value (None when a row is missing)."""
    def get(system: str, regime: str, key: str) -> float | None:
        row = next((r for r in rows if (r["system"], r["regime"], r.get("cores")) == (system, regime, None)),
                   None)
        return row.get(key) if row and row["status"] == "ok" else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(a / b, 3)

    rss_limit = budget + topology_bytes(store) + RUNTIME_ALLOWANCE
    gn_rss = [get("gnnssd", r, "peak_rss_bytes") for r in REGIMES]
    checks = [
        ("end-to-end time, gnnssd / memory", get("gnnssd", "end-to-end", "ratio_to_memory"), "<=", 1.15),
        ("loader-only throughput, gnnssd / memory",
         ratio(get("gnnssd", "loader-only", "batches_per_s"), get("memory", "loader-only", "batches_per_s")),
         ">=", 0.8),
    ]
    for regime in REGIMES:
        for other, factor in (("mmap", 5.0), ("per-row", 3.0)):
            checks.append((f"{regime} throughput, gnnssd / {other}",
                           ratio(get("gnnssd", regime, "batches_per_s"), get(other, regime, "batches_per_s")),
                           ">=", factor))
    checks.append(("gnnssd peak RSS, bytes", max(gn_rss) if None not in gn_rss else None, "<=", rss_limit))
    for regime in REGIMES:
        checks.append((f"{regime} throughput, gnnssd checksums on / off",
                       ratio(get("gnnssd", regime, "batches_per_s"), get(NO_VERIFY, regime, "batches_per_s")),
                       ">=", 0.95))
    return [{"target": name, "value": value, "want": f"{op} {limit}",
             "met": None if value is None else (value <= limit if op == "<=" else value >= limit)}
            for name, value, op, limit in checks]


def _fmt(row: dict[str, Any]) -> str:
    pinned = "" if row.get("cores") is None else f" [{row['cores']} core{'s' * (row['cores'] > 1)}]"
    head = f"{row['system'] + pinned:<25} {row['regime']:<12}"
    if row["status"] != "ok":
        return f"{head} {row['status']}"
    ratio = row.get("ratio_to_memory")
    stages = " ".join(f"{k} {v:.1f}" for k, v in row["stages_s"].items())
    stopped = f"  (stopped by the time limit after {row['batches']} mini-batches)" if row["stopped_by_time_limit"] else ""
    useful = format_bytes(row["useful_bytes"]) if "useful_bytes" in row else "-"
    amp = f"{row['read_amplification']:.2f}" if "read_amplification" in row else "-"
    return (f"{head} {row['batches_per_s']:>9.3f} {'-' if ratio is None else f'{ratio:.2f}':>7} "
            f"{format_bytes(row['bytes_read']):>10} {useful:>10} {amp:>6} "
            f"{format_bytes(row['peak_rss_bytes']):>10}  {stages}{stopped}")


HEADER = (f"{'system':<25} {'regime':<12} {'batches/s':>9} {'x mem':>7} {'read':>10} {'useful':>10} "
          f"{'ampl':>6} {'peak RSS':>10}  stages (s)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="medium preset, budget 1/8 of its features, 6 mini-batches")
    p.add_argument("--json", type=Path, default=Path("bench_out/bench_train.json"),
                   help="where to write {'rows': [...]} (default: %(default)s)")
    p.add_argument("--store", type=Path, help="an existing store (default: make one in --work)")
    p.add_argument("--work", type=Path, default=Path("bench_out/work"),
                   help="where the synthetic store is made or reused (default: %(default)s)")
    p.add_argument("--preset", help="synthetic preset (default large, --quick medium)")
    p.add_argument("--order", choices=ORDERS, default="degree",
                   help="node order of a store made here (default: %(default)s, hot rows first)")
    p.add_argument("--budget", help="memory budget, e.g. 1.25GiB (default 1.25GiB; --quick: "
                                    "1/8 of the store's features)")
    p.add_argument("--batches", type=int, help="mini-batches per run (default 100, --quick 6)")
    p.add_argument("--beside-x", action="store_true",
                   help="a loader that counts the x arrays it hands out in its memory budget gets them on top "
                        "of --budget (as bench_feed's --beside-x): --quick's 1/8 of medium is 153 MiB, and its "
                        "x arrays alone take 457 MiB")
    p.add_argument("--time-limit", type=float, default=900,
                   help="seconds per run: a system still running then stops, and its throughput "
                        "is over the mini-batches it did (flagged in the table)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-budget", default="auto",
                   help="gnnssd: disk space for compact blocks (default: auto, the config's "
                        f"default; {EXTENTS} runs with 0: extents only)")
    p.add_argument("--mega-batch", type=int, default=16,
                   help="gnnssd: mini-batches per mega-batch (split to fit the buffers)")
    p.add_argument("--seed-order", choices=("random", "proximity"), default="random",
                   help="every system's training seed order (NodeLoader seed_order; default %(default)s)")
    p.add_argument("--seed-window", type=int, default=16384,
                   help="seeds per run of the proximity order (default %(default)s)")
    p.add_argument("--systems", nargs="+", choices=(*SYSTEMS, EXTENTS, NO_VERIFY, REUSE),
                   default=[*SYSTEMS, EXTENTS],
                   help=f"(default: %(default)s; {EXTENTS}: gnnssd with block_budget 0; {NO_VERIFY}: "
                        f"gnnssd without page checksums; {REUSE}: gnnssd training --reuse-epochs epochs on "
                        "the samples of one epoch of --batches mini-batches)")
    p.add_argument("--reuse-epochs", type=int, default=4,
                   help=f"{REUSE}: epochs per sample (sampler.reuse_epochs; default %(default)s)")
    p.add_argument("--cores", nargs="*", type=int, default=[],
                   help="also run memory and gnnssd loader-only pinned to the first N cores, for "
                        "each N given (e.g. --cores 1 2)")
    p.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    p.add_argument("--limit-page-cache", action="store_true",
                   help="hold all but budget + headroom of memory during mmap/per-row/gnnssd runs")
    p.add_argument("--headroom", help="memory left beside the budget for the process itself "
                                      "(default: topology + 1.5 GiB)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--hold", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hold is not None:
        hold_memory(args.hold)
        return 0
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0

    args.preset = args.preset or ("medium" if args.quick else "large")
    args.batches = args.batches or (6 if args.quick else 100)
    store = open_or_make_store(args)
    budget = parse_bytes(args.budget) if args.budget else (
        store.feature_bytes // 8 if args.quick else parse_bytes("1.25GiB"))
    if args.block_budget.strip().lower() != "auto":
        args.block_budget = parse_bytes(args.block_budget)
    if any(not 0 < n <= len(os.sched_getaffinity(0)) for n in args.cores):
        p.error(f"--cores {args.cores}: each must be in 1..{len(os.sched_getaffinity(0))} (this "
                "process's cores)")
    args.headroom = (parse_bytes(args.headroom) if args.headroom
                     else topology_bytes(store) + RUNTIME_ALLOWANCE)
    print(f"store {store.path}: {store.num_nodes:,} nodes, features "
          f"{format_bytes(store.feature_bytes)} = {store.feature_bytes / budget:.1f}x the budget "
          f"of {format_bytes(budget)}; {args.batches} mini-batches per run", flush=True)
    if store.feature_bytes < 8 * budget:
        print("note: the features are less than 8x the budget", flush=True)
    print(HEADER, flush=True)
    rows = bench(args, store, budget)
    print("\n" + HEADER)
    for row in rows:
        print(_fmt(row))
    checks = targets(rows, budget, store)
    for c in checks:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[c["met"]]
        print(f"target {c['target']}: {c['value']} (want {c['want']}): {verdict}")
    print(f"(RSS limit: budget + topology + 1.5 GiB = "
          f"{format_bytes(budget + topology_bytes(store) + RUNTIME_ALLOWANCE)})")
    meta = {"store": str(store.path), "nodes": store.num_nodes, "feature_bytes": store.feature_bytes,
            "budget_bytes": budget, "topology_bytes": topology_bytes(store),
            "batches": args.batches, "seed": args.seed, "fanouts": fanouts_for(store), "batch_size": BATCH_SIZE,
            "block_budget": args.block_budget, "seed_order": args.seed_order, "seed_window": args.seed_window,
            "reuse_epochs": args.reuse_epochs,
            "model": asdict(model_for(store)), "limit_page_cache": args.limit_page_cache,
            "headroom_bytes": args.headroom, "kernel": platform.release(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "targets": checks, "meta": meta}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
