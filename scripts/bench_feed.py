#!/usr/bin/env python3
"""Loader-only CPU profile: what feeding a GPU costs the host, per mini-batch, per thread, per stage.

Runs `gnnssd.NodeLoader` loader-only (no model: each mini-batch's x is summed on the caller's
thread, the cost of touching it measured there and left out of the loader's CPU) on one store,
each (system, threads) in a fresh process, and prints a table and writes JSON:
  - process CPU-seconds per mini-batch (getrusage), and the loader's (process less the touch);
  - CPU-seconds per mini-batch of every thread (/proc/self/task/*/schedstat, sampled after
    the first mini-batch and before the loader is closed; Python threads by name, the rest
    by kernel name: numba's and OpenMP's workers are "native", io_uring's "iou-wrk");
  - wall seconds per mini-batch of every loader stage (the loader's StageTimer);
  - mini-batches/s, and bytes read per useful byte (the loader's own counters; lumpy over
    few mini-batches: a repack window's scan is counted when it happens).
Systems: `memory` (DGL's sampler, the features in RAM), `ssd` (this tree's `features: ssd`;
`ssd-extents`: with `ssd.block_budget: 0`, no compact blocks),
and with --baseline COMMIT... `ssd@COMMIT`: the same loader from each commit's sources
(extracted under --work, with this tree's compiled I/O engine where the engine's C sources
are the same, else their own, built there), so a before/after is one table. The first mini-batch of each run (JIT
caches loaded, pipeline filled) is not measured; a warm-up run per source tree fills numba's
caches first.

--threads N... runs every system once per N, with NUMBA_NUM_THREADS, OMP_NUM_THREADS and
torch's threads set to N (and the ssd loader's `threads` option where the tree has it).
--packers N... runs this tree's ssd loader once per N (`ssd.packers`; 0: planning and
repacking in the trainer's threads; with ssd-extents the packers plan page reads), and each
row says `packers` (those the loader ran with: a baseline tree's, and this tree's without
--packers, are its default), `trainer_cpu_s_per_batch` (the trainer process's CPU less the
touch: the consuming side when packers are processes),
`cpu_s_per_batch` (the trainer's and its packer processes' CPU together, psutil's view of
the children), `first_batch_s` (iterator creation to the first mini-batch),
`second_half_batches_per_s` (the rate over the second half of the measured mini-batches:
past the stream's start, its own and first windows),
`packer_start_cpu_s` (the packers' start-up, an interpreter, imports and the store each,
counted in those CPU seconds; `cpu_s_per_batch_less_packer_start` without it) and where the
bytes read went per useful byte (`read_parts_per_useful_byte`: repack scans "packing",
compact blocks "packed", page extents "extents").
--rounds N repeats the whole set of runs N times, the runs after memory's in reverse order in
every second round (base, this; this, base; ...): a run's place in an invocation biases it
(the second ssd run of one was the faster in all of 4 invocations, whatever its code:
docs/BENCHMARKS.md, issue 46, thirteenth round), so a comparison takes an even number of
rounds. Each row says its `round`, its ratio is to that round's memory row, and the JSON's
`summary` (and a table at the end) gives each run's figures over the rounds.
Before and after the runs, the drive's O_DIRECT read rate over the features file (1 MiB
requests, the cost model's calibration measure) is taken (`drive_read_mb_s`,
`drive_read_mb_s_after` in the JSON's meta); each row says what the drive moved per
mini-batch (`moved_mb_per_batch`: bytes read and the packers' blocks written), and the table
the MB/s that makes at the row's rate: a loader bound by the drive moves about what a plain
reader gets.

    python scripts/bench_feed.py --store DIR [--quick] [--budget SIZE] [--batches N]
        [--threads 1 2 ...] [--packers 1 2 ...] [--baseline 4c691b2 ...] [--systems memory ssd] [--rounds N]
        [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

FANOUTS = [15, 10, 5]
TYPED_FANOUTS = [10, 5]
BATCH_SIZE = 1024
EXTENTS = "ssd-extents"  # this tree's loader with ssd.block_budget 0 (no repack), beside its default
SYSTEMS = ("memory", "ssd", EXTENTS)
ENGINE_SOURCES = ("io_engine/csrc", "io_engine/build_ffi.py")
ROOT = Path(__file__).resolve().parent.parent
#: folders the package installs under the gnnssd namespace (pyproject's package-dir)
NAMESPACED = ("datasets", "io_engine", "sampler", "storage_format")


# --- the child: one (system, threads) run ------------------------------------------------

def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every live thread of this process, by thread ID, with its label."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            comm = (task / "comm").read_text().strip()
        except (OSError, ValueError):
            continue  # exited meanwhile
        tid = int(task.name)
        label = names.get(tid) or ("iou-wrk" if comm.startswith("iou-wrk") else f"native ({comm})")
        out[tid] = (label, ns / 1e9)
    return out


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu() -> dict[int, float]:
    """CPU seconds of every live child process (the ssd loader's packers), by process ID."""
    import psutil

    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue  # exited meanwhile
        out[proc.pid] = times.user + times.system
    return out


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One run in this fresh process (gnnssd imported from spec["tree"] when given)."""
    if spec["tree"]:
        sys.path.insert(0, spec["tree"])  # ahead of the editable install's finder
    if spec["system"] == "memory":  # all the features in RAM: the OOM killer's first choice, not a neighbour
        Path("/proc/self/oom_score_adj").write_text("1000\n")
    import numpy as np
    import torch

    import gnnssd
    from gnnssd import NodeLoader
    from gnnssd.storage_format import Store

    torch.set_num_threads(spec["threads"])
    store = Store.open(spec["store"])
    fanouts = FANOUTS if store.schema.is_homogeneous else TYPED_FANOUTS
    seeds = np.asarray(store.train_store_ids)
    options: dict[str, Any] = {"memory_budget": spec["budget"]}
    if spec["system"] != "memory":
        options.update(spec["ssd_options"])
        if spec["system"] == EXTENTS:
            options["block_budget"] = 0
        if not spec["tree"]:  # this tree's loader takes its thread count (a baseline's: the environment)
            options["threads"] = spec["threads"]
            if spec.get("packers") is not None:
                options["packers"] = spec["packers"]
    def opened(budget: int) -> Any:
        return NodeLoader(store, store.original_ids(seeds), fanouts=fanouts, batch_size=spec["batch_size"],
                          features="memory" if spec["system"] == "memory" else "ssd", shuffle=True,
                          seed=spec["seed"], device=torch.device("cpu"), eval_fanouts=fanouts,
                          eval_batch_size=spec["batch_size"], **{**options, "memory_budget": budget})

    if spec.get("beside_x") and spec["system"] != "memory":
        options["memory_budget"] = budget_beside_x(spec["budget"], opened)
    with opened(options["memory_budget"]) as loader:
        loader.set_epoch(1)
        first_start = time.perf_counter()
        batches = iter(loader)
        touch_s = 0.0

        def touch(batch: Any) -> None:
            """Read every value of x on this thread alone (NumPy's sum, not torch's: torch's
            runs on its intra-op OpenMP workers, whose share of the touch and their spinning
            after it were counted in the trainer's CPU, ~0.01 CPU-s a mini-batch at 2 threads)."""
            nonlocal touch_s
            start = time.thread_time()
            xs = batch.x.values() if isinstance(batch.x, dict) else [batch.x]
            float(sum(x.numpy().sum() for x in xs))
            touch_s += time.thread_time() - start

        first = next(batches)
        first_batch_s = time.perf_counter() - first_start
        touch(first)  # not measured: JIT caches loaded, pipeline filled
        del first
        touch_s = 0.0
        loader.timer.take()
        loader.io_stats()
        threads0, cpu0, children0 = thread_cpu(), process_cpu(), children_cpu()
        start, n = time.perf_counter(), 0
        half_at = start  # when the first half of the measured mini-batches had come
        for batch in batches:
            touch(batch)
            del batch
            n += 1
            if n == spec["batches"] // 2:
                half_at = time.perf_counter()
            if n == spec["batches"]:
                break
        seconds = time.perf_counter() - start
        second_half = (n - spec["batches"] // 2) / (start + seconds - half_at) if n == spec["batches"] else None
        if n == 0:
            raise SystemExit(f"epoch 1 has one mini-batch of {spec['batch_size']} seeds, and the first is not "
                             "measured: lower --batch-size")
        cpu, threads1, io1, stages = process_cpu() - cpu0, thread_cpu(), loader.io_stats(), loader.timer.take()
        packers_cpu = sum(s - children0.get(pid, 0.0) for pid, s in children_cpu().items())
        backend = getattr(loader, "backend", None)  # the ssd loader's (memory mode has none of these)
        # the packers' start-up (interpreter, imports, store) counted in packers_cpu: what of
        # each one's start came after the measurement began
        starts = getattr(backend, "packer_start_cpu_s", {})
        packer_start_cpu = sum(max(0.0, s - children0.get(pid, 0.0)) for pid, s in starts.items())
        # the mini-batches the trainer planned itself (page reads) before the packers' windows
        own_minibatches = getattr(backend, "own_minibatches", None)
        # the packers the loader resolved (a baseline tree runs with its default: auto)
        packers = getattr(backend, "packers", None)
        batches.close()
    per_thread: dict[str, float] = {}
    for tid, (label, s) in threads1.items():
        per_thread[label] = per_thread.get(label, 0.0) + s - threads0.get(tid, (label, 0.0))[1]
    per_thread["(exited threads)"] = cpu - sum(per_thread.values())
    io = io1  # NodeLoader.io_stats: since its previous call (io0, which took the set-up's)
    useful = io.get("useful_bytes", 0)
    return {
        "system": spec["system"], "threads": spec["threads"], "tree": spec["tree_label"],
        "packers": packers if spec["system"] != "memory" else None,
        "first_batch_s": round(first_batch_s, 3),
        "trainer_cpu_s_per_batch": round((cpu - touch_s) / n, 4),
        "packers_cpu_s_per_batch": round(packers_cpu / n, 4),
        "packer_start_cpu_s": round(packer_start_cpu, 3),
        "own_minibatches": own_minibatches if packers else None,
        "cpu_s_per_batch_less_packer_start": round((cpu + packers_cpu - packer_start_cpu) / n, 4),
        "gnnssd_module": str(Path(gnnssd.__file__).parent), "batches": n, "seconds": round(seconds, 3),
        "batches_per_s": round(n / seconds, 3),
        # the rate past the stream's start (its first windows): the second half of the measured ones
        "second_half_batches_per_s": None if second_half is None else round(second_half, 3),
        "cpu_s_per_batch": round((cpu + packers_cpu) / n, 4),
        "loader_cpu_s_per_batch": round((cpu + packers_cpu - touch_s) / n, 4),
        "touch_cpu_s_per_batch": round(touch_s / n, 4),
        "thread_cpu_s_per_batch": {k: round(v / n, 4) for k, v in sorted(per_thread.items()) if abs(v) >= 5e-4},
        "stage_s_per_batch": {k: round(v / n, 4) for k, v in stages.items()},
        "io": io,
        "read_per_useful_byte": round(io["bytes_read"] / useful, 3) if useful else None,
        # what the drive moved for each mini-batch: reads and the packers' block writes
        "moved_mb_per_batch": round((io.get("bytes_read", 0) + io.get("bytes_written", 0)) / n / 1e6, 1),
        "read_parts_per_useful_byte": {key[: -len("_read_bytes")]: round(v / useful, 3) for key, v in io.items()
                                       if key.endswith("_read_bytes")} if useful else {},
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "memory_budget": options["memory_budget"],
    }


# --- the baseline tree -------------------------------------------------------------------

def budget_beside_x(budget: int, opened: Callable[[int], Any]) -> int:
    """`budget` plus the x arrays of the ssd loader `opened(budget)` opens: a loader that
    counts them in ssd.memory_budget (be39c60 on) gets them on top of `budget`, which alone
    they may pass (1/8 of `medium`'s features); a tree that does not count them, nothing."""
    with opened(budget) as probe:
        split = getattr(getattr(probe, "backend", None), "budget", None)
        return budget + getattr(split, "held_bytes", 0)


def baseline_tree(commit: str, work: Path) -> Path:
    """`commit`'s sources laid out as the installed package (the component folders inside
    gnnssd/) with its compiled I/O engine: this tree's where the engine's sources are the
    same, else built from the commit's (cffi, as the install does); returns the folder to
    put on sys.path."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=ROOT, check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    same_engine = subprocess.run(["git", "diff", "--quiet", full, "HEAD", "--", *ENGINE_SOURCES],
                                 cwd=ROOT).returncode == 0
    dest = work / f"tree-{full[:12]}"
    if (dest / "READY").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", full], cwd=ROOT, check=True,
                             stdout=subprocess.PIPE).stdout
    tar_path = dest / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest)
    tar_path.unlink()
    for name in NAMESPACED:
        (dest / "gnnssd" / name).symlink_to(Path("..") / name)
    if same_engine:
        for engine in (ROOT / "io_engine").glob("_gnnssd_io*.so"):
            shutil.copy2(engine, dest / "io_engine" / engine.name)
    else:  # compiled in a folder of its own (no project files there for setuptools to find)
        build = dest / "engine-build"
        build.mkdir()
        subprocess.run([sys.executable, str(dest / "io_engine" / "build_ffi.py")], cwd=build, check=True,
                       stdout=subprocess.DEVNULL)
        for engine in (build / "gnnssd" / "io_engine").glob("_gnnssd_io*.so"):
            shutil.move(engine, dest / "io_engine" / engine.name)
    (dest / "READY").write_text(full + "\n")
    return dest


def tree_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """--baseline, --work, --json (bench_out/NAME.json) and the hidden --child of a script
    that measures this tree beside baseline commits' trees, each run in a fresh process."""
    p.add_argument("--baseline", nargs="+", default=[], help="commits to run beside this tree")
    p.add_argument("--work", type=Path, default=Path("bench_out/work"), help="where baseline trees go")
    p.add_argument("--json", type=Path, default=Path(f"bench_out/{name}.json"))
    p.add_argument("--child", help=argparse.SUPPRESS)


def store_arguments(p: argparse.ArgumentParser) -> None:
    """--store (required, except in the --child process, which gets it in its spec),
    --batch-size and --seed of a script that loads mini-batches from a store."""
    p.add_argument("--store", type=Path, help="the store to load from")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="seeds per mini-batch (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)


def parse_or_run_child(p: argparse.ArgumentParser, child: Callable[[dict[str, Any]], Any]) -> argparse.Namespace | None:
    """The parsed arguments, or None once --child's run has printed its JSON result (the
    child process of a tree_arguments script); a store_arguments script without --store
    stops with the usage error."""
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return None
    if "store" in vars(args) and args.store is None:
        p.error("--store is required (make one with `gnnssd preprocess synthetic --preset medium`)")
    return args


def compared_trees(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(label, the tree's folder, '' for this one) of each --baseline commit, then this tree."""
    args.work.mkdir(parents=True, exist_ok=True)
    return [(f"@{c}", str(baseline_tree(c, args.work.resolve()))) for c in args.baseline] + [("this tree", "")]


# --- the parent --------------------------------------------------------------------------

def drive_read_rate(path: Path, seconds: float = 1.0) -> float:
    """MB/s of 1 MiB O_DIRECT reads of `path`, 32 in flight (the cost model's calibration
    measure, pipeline.calibration.measure_reads): what the drive gives a plain reader, beside
    which a row's moved bytes times its rate say how busy its loader kept the drive (a shared
    or virtual drive varies from minute to minute: one figure, not a bound)."""
    from gnnssd.pipeline.calibration import measure_reads
    from gnnssd.pipeline.direct_io import DirectIO

    io = DirectIO(queue_depth=32)
    try:
        return measure_reads(io, path, 1 << 20, seconds)["bytes_per_s"] / 1e6
    finally:
        io.shutdown()


def _option(text: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE as JSON where it parses (numbers, true/false), else a string."""
    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--ssd {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "NUMBA_NUM_THREADS": str(spec["threads"]), "OMP_NUM_THREADS": str(spec["threads"])}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                          text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"system": spec["system"], "threads": spec["threads"], "tree": spec["tree_label"],
                "status": f"failed (exit {proc.returncode}; see stderr above)"}
    return {**json.loads(lines[-1]), "status": "ok"}


def fmt(row: dict[str, Any], memory: dict[str, Any] | None, drive: float | None) -> str:
    head = f"{row['system']:<16} {row['threads']:>3} {'-' if row.get('packers') is None else row['packers']:>4}"
    if row["status"] != "ok":
        return f"{head}  {row['status']}"
    ratio = f"{row['batches_per_s'] / memory['batches_per_s']:.2f}" if memory else "-"
    amp = "-" if row["read_per_useful_byte"] is None else f"{row['read_per_useful_byte']:.2f}"
    threads = " ".join(f"{k} {v:.3f}" for k, v in row["thread_cpu_s_per_batch"].items())
    stages = " ".join(f"{k} {v:.3f}" for k, v in row["stage_s_per_batch"].items())
    parts = " ".join(f"{k} {v:.2f}" for k, v in row.get("read_parts_per_useful_byte", {}).items())
    moved = row.get("moved_mb_per_batch")
    through = (f": the drive at {moved * row['batches_per_s']:.0f} MB/s"
               + (f" (its read rate before the runs: {drive:.0f})" if drive else "")) if moved else ""
    half = row.get("second_half_batches_per_s")
    half_ratio = f" ({half / memory['second_half_batches_per_s']:.2f}x memory's)" if (
        half and memory and memory.get("second_half_batches_per_s")) else ""
    return (f"{head} {row['batches_per_s']:>7.3f} {ratio:>6} {row['cpu_s_per_batch']:>8.3f} "
            f"{row['loader_cpu_s_per_batch']:>8.3f} {row['trainer_cpu_s_per_batch']:>8.3f} "
            f"{row['first_batch_s']:>7.2f} {amp:>6}\n"
            + (f"      the second half of the measured mini-batches: {half:.3f} mb/s{half_ratio}\n" if half else "")
            + f"      threads (CPU s/mb): {threads}\n"
            f"      stages (wall s/mb): {stages}\n      read per useful byte: {parts}"
            + (f"\n      moved (read + written) per mini-batch: {moved:.0f} MB{through}" if moved else ""))


def run_order(runs: list[Any], rounds: int, threads: list[int]) -> list[tuple[int, Any, int]]:
    """(round, run, threads) in the order to run them: per round and thread count, memory's
    run first (each round's reference), then the others, reversed in every second round."""
    first, rest = [r for r in runs if r[0] == "memory"], [r for r in runs if r[0] != "memory"]
    return [(round_, run, count) for round_ in range(rounds) for count in threads
            for run in first + (rest[::-1] if round_ % 2 else rest)]


#: The figures `summarize` gives over a run's rounds.
SUMMED = ("batches_per_s", "x_memory", "second_half_batches_per_s", "first_batch_s", "trainer_cpu_s_per_batch",
          "cpu_s_per_batch", "moved_mb_per_batch")


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's (system, tree, threads, packers) figures over its rounds: mean, min, max,
    its ratio to memory taken within each round."""
    memory = {(r["round"], r["threads"]): r for r in rows if r["system"] == "memory" and r["status"] == "ok"}
    runs: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] != "ok":
            continue
        ref = memory.get((row["round"], row["threads"]))
        ratio = row["batches_per_s"] / ref["batches_per_s"] if ref else None
        runs.setdefault((row["system"], row["tree"], row["threads"], row.get("packers")), []).append(
            {**row, "x_memory": ratio})
    summary = []
    for (system, tree, threads, packers), got in runs.items():
        entry = {"system": system, "tree": tree, "threads": threads, "packers": packers, "rounds": len(got)}
        for key in SUMMED:
            values = [r[key] for r in got if r.get(key) is not None]
            if values:
                entry[key] = {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}
        summary.append(entry)
    return summary


def fmt_summary(entry: dict[str, Any]) -> str:
    figures = " ".join(f"{key} {v['mean']:.3f} ({v['min']:.3f}-{v['max']:.3f})" for key, v in entry.items()
                       if isinstance(v, dict))
    return (f"{entry['system']:<16} {entry['tree']:<12} {entry['threads']:>3} "
            f"{'-' if entry['packers'] is None else entry['packers']:>4} x{entry['rounds']}: {figures}")


HEADER = (f"{'system':<16} {'thr':>3} {'pack':>4} {'mb/s':>7} {'x mem':>6} {'CPU/mb':>8} {'ldr/mb':>8} "
          f"{'trn/mb':>8} {'first s':>7} {'rd/use':>6}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    store_arguments(p)
    p.add_argument("--quick", action="store_true", help="budget 1/8 of the features, 8 mini-batches")
    p.add_argument("--budget", help="the ssd loader's memory budget (default: 1/8 of the features)")
    p.add_argument("--beside-x", action="store_true",
                   help="a loader that counts the x arrays it hands out in ssd.memory_budget (be39c60 on) gets "
                        "theirs on top of the budget, which alone they may pass (--quick's 1/8 of medium); its "
                        "queues are sized from the whole, so it splits the rest unlike a tree before be39c60")
    p.add_argument("--batches", type=int, help="measured mini-batches per run (default 8 with --quick, else 30)")
    p.add_argument("--threads", nargs="+", type=int, default=[os.cpu_count() or 1],
                   help="thread counts to run every system with (default: the machine's cores)")
    p.add_argument("--packers", nargs="+", type=int, default=[None],
                   help="ssd.packers of this tree's ssd runs, one run per value (default: the loader's, auto)")
    p.add_argument("--systems", nargs="*", choices=SYSTEMS, default=list(SYSTEMS),
                   help=f"memory, and ssd: this working tree's loader ({EXTENTS}: with ssd.block_budget 0); the --baseline "
                        "commits run either way (none: only they)")
    p.add_argument("--ssd", nargs="+", default=[], metavar="KEY=VALUE",
                   help="options of the ssd runs (SSDConfig's fields, e.g. block_budget=0 verify_checksums=false)")
    p.add_argument("--rounds", type=int, default=1,
                   help="times the whole set of runs is made, the runs after memory's reversed in every second "
                        "round (default 1; take an even number to compare trees or packer counts)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up run per source tree")
    tree_arguments(p, "bench_feed")  # --baseline: ssd@COMMIT, that commit's ssd loader
    args = parse_or_run_child(p, child)
    if args is None:
        return 0
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected 1 or more")
    from gnnssd.core.budget import format_bytes, parse_bytes
    from gnnssd.storage_format import Store

    store = Store.open(args.store)
    budget = parse_bytes(args.budget) if args.budget else store.feature_bytes // 8
    batches = args.batches or (8 if args.quick else 30)
    trees = [(f"ssd@{commit}", str(baseline_tree(commit, args.work.resolve())), commit) for commit in args.baseline]
    trees += [(name, "", "this tree") for name in ("ssd", EXTENTS) if name in args.systems]
    systems = ([("memory", "", "this tree")] if "memory" in args.systems else []) + trees
    print(f"store {store.path}: {store.num_nodes:,} nodes, features {format_bytes(store.feature_bytes)}, "
          f"budget {format_bytes(budget)}; {batches} mini-batches per run", flush=True)
    base = {"store": str(store.path), "budget": budget, "batches": batches, "seed": args.seed,
            "batch_size": args.batch_size, "beside_x": args.beside_x,
            "ssd_options": dict(_option(o) for o in args.ssd)}
    drive = drive_read_rate(store.features_path) if trees else None
    if drive:
        print(f"drive: O_DIRECT reads of {Path(store.features_path).name} at {drive:.0f} MB/s "
              "(1 MiB requests, 32 in flight)", flush=True)
    if not args.no_warmup:
        for system, tree, label in systems[1 if systems and systems[0][0] == "memory" else 0:]:
            run_child({**base, "system": system, "tree": tree, "tree_label": label, "threads": args.threads[0],
                       "batches": 2})
    rows = []
    print(HEADER, flush=True)
    runs = [(system, tree, label, packers) for system, tree, label in systems
            for packers in (args.packers if system in ("ssd", EXTENTS) else [None])]
    for round_, (system, tree, label, packers), threads in run_order(runs, args.rounds, args.threads):
        row = {**run_child({**base, "system": system, "tree": tree, "tree_label": label, "threads": threads,
                            "packers": packers}), "round": round_}
        rows.append(row)
        memory = next((r for r in rows if r["system"] == "memory" and r["threads"] == threads
                       and r["round"] == round_ and r["status"] == "ok"), None)
        print(fmt(row, memory, drive), flush=True)
    summary = summarize(rows)
    if args.rounds > 1:
        print(f"over {args.rounds} rounds (mean, min-max):\n" + "\n".join(fmt_summary(s) for s in summary), flush=True)
    after = drive_read_rate(store.features_path) if trees else None
    if after:
        print(f"drive: {after:.0f} MB/s after the runs", flush=True)
    meta = {**base, "feature_bytes": store.feature_bytes, "fanouts": FANOUTS, "drive_read_mb_s": drive,
            "drive_read_mb_s_after": after,
            "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "summary": summary, "meta": meta}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
