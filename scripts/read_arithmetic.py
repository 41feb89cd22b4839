#!/usr/bin/env python3
"""The arithmetic of gnnssd's reads at one memory budget, and the rate the drive allows.

Per mini-batch of memory mode's sampler (fanouts 15,10,5, batch 1024, as bench_feed): its
input rows, its cold rows (NumPy unique of the input rows minus the rows the ssd loader's
hot cache holds at this budget), the 4 KiB pages those lie on, and the extents the read
planner reads them by (the store's cost model). Then the drive, measured here with O_DIRECT
through the loader's engine: each mini-batch's planned extents read and timed, 1 MiB reads
at queue depth, and 1 MiB reads beside a sequential writer (what packing's writes meet).

Then one window of the packers' own work, timed in this process: W mini-batches of the
ssd loader (packers 1, its block budget) planned, their blocks written in one scan of
features.bin (the real Packer and block writer), and every mini-batch's reads made back
(its block, or its pages where it got none). Its scan is timed once alone, without the
writes: what is left of the repack's time is the block writer's, so the window gives the
drive's write rate as packing meets it.

From those, the most mini-batches a second each way of getting a mini-batch's cold rows off
this drive allows, beside memory mode's measured rate (its first mini-batch too):
  - in place: the planned extents, at the time their reads took (no packing);
  - packed apart: every cold row written once to a block at the block writer's rate, then
    read back once at the read rate, with no scan and no write beside a read (a bound from
    above: a window of infinite size on a drive that never mixes the two);
  - packed, a window of W: the window's timed scan, writes and reads back, per mini-batch
    (no overlap between them: the drive's time, one after the other);
  - useful once: the cold bytes alone at the read rate. Only packing done before training
    reaches this; with fresh samples every epoch (the default) a mini-batch's cold rows are
    known only once the epoch samples it.
A drive that writes far slower than it reads bounds packing by its writes: a loader that
reads fresh samples from it runs no faster than the better of in place and packed apart,
however many cores pack for it.

    python scripts/read_arithmetic.py STORE [--budget 153MiB] [--beside-x] [--batches 8]
        [--batch-size 1024] [--window 10] [--block-budget auto] [--seconds 2] [--scratch DIR] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from gnnssd import NodeLoader
from gnnssd.core import format_bytes, parse_bytes
from gnnssd.pipeline import DirectIO
from gnnssd.pipeline.calibration import measure_reads, measure_write
from gnnssd.pipeline.packers import Packer, PackerSpec, WindowWork
from gnnssd.sampler import Fanouts, PlanConfig, Strategy, pages_plan
from gnnssd.storage_format import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feed import budget_beside_x  # noqa: E402  (a sibling script)

PAGE = 4096
FANOUTS = [15, 10, 5]
BATCH_SIZE = 1024
MIB = 1 << 20


def pages_of(rows: np.ndarray, row_bytes: int) -> np.ndarray:
    """The sorted distinct 4 KiB pages of features.bin that rows `rows` lie on (a row may
    span several)."""
    first = rows.astype(np.int64) * row_bytes // PAGE
    span = (rows.astype(np.int64) * row_bytes + row_bytes - 1) // PAGE - first + 1
    starts = np.repeat(first, span)
    steps = np.arange(len(starts)) - np.repeat(np.cumsum(span) - span, span)
    return np.unique(starts + steps)


def open_ssd(store: Store, budget: int, beside_x: bool, batch_size: int, block_budget: int | str = "auto"
             ) -> tuple[Any, Any, int, str, tuple[PackerSpec, PlanConfig]]:
    """The ssd loader's hot rows, cost model and memory budget at `budget` (plus its x
    arrays with `beside_x`, as bench_feed's --beside-x), its budget's line, and what its
    packers plan with (their spec, and a training stream's config): its default settings
    (block budget included) and one packer, as bench_feed opens it."""
    def opened(total: int) -> NodeLoader:
        return NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=batch_size, features="ssd",
                          memory_budget=total, block_budget=block_budget, packers=1, shuffle=True, seed=0,
                          device="cpu", eval_fanouts=FANOUTS, eval_batch_size=batch_size)

    if beside_x:
        budget = budget_beside_x(budget, opened)
    with opened(budget) as loader:
        backend = loader.backend
        spec = backend._packer_spec(), backend._plan_config(Fanouts.parse(FANOUTS).array(store.schema))
        return backend.hot.members, backend.cost_model, budget, backend.budget.describe(), spec


def memory_mode(store: Store, batches: int, batch_size: int) -> tuple[float, float, list[np.ndarray]]:
    """Memory mode's first mini-batch (seconds from the iterator's creation) and rate over the
    `batches` after it (x touched, as bench_feed), and the store rows of every input row."""
    inv = np.asarray(store.inv)
    with NodeLoader(store, store.train_idx, fanouts=FANOUTS, batch_size=batch_size, features="memory",
                    shuffle=True, seed=0, device="cpu") as loader:
        loader.set_epoch(1)
        start = time.perf_counter()
        it = iter(loader)
        inputs, first_s, rate_start = [], 0.0, 0.0
        for k in range(batches + 1):
            batch = next(it, None)
            if batch is None:
                break
            float(batch.x.numpy().sum())
            inputs.append(batch.input_nodes.numpy().copy())
            if k == 0:
                first_s = time.perf_counter() - start
                rate_start = time.perf_counter()
        if len(inputs) < 2:
            raise SystemExit(f"{store.path}: the training split makes {len(inputs)} mini-batch(es) of "
                             f"{batch_size}; a rate needs 2 or more (lower --batch-size)")
        rate = (len(inputs) - 1) / (time.perf_counter() - rate_start)
    return first_s, rate, [inv[ids] for ids in inputs]


def read_in_place(io: DirectIO, path: Path, offsets: np.ndarray, lengths: np.ndarray, chunk: int) -> float:
    """Seconds to read the extents (offsets, lengths) of `path`, chunk bytes at a time."""
    buf = io.alloc(max(chunk, int(lengths.max(initial=0))))
    f = io.open(path)
    try:
        start, lo = time.perf_counter(), 0
        while lo < len(offsets):
            ends = np.cumsum(lengths[lo:])
            hi = lo + max(1, int(np.searchsorted(ends, chunk, "right")))
            dest = np.concatenate([[0], ends[: hi - lo - 1]]).astype(np.int64)
            io.read_extents(f, offsets[lo:hi], lengths[lo:hi], buf, dest)
            lo = hi
        return time.perf_counter() - start
    finally:
        io.close(f)


def packed_window(spec: PackerSpec, config: PlanConfig, store: Store, count: int, batch_size: int,
                  scratch: Path) -> dict[str, Any]:
    """One packer window of `count` mini-batches (seeds: a shuffle of the training split),
    timed in this process: planned, its scan read alone, repacked (the scan again, with the
    block writer's writes), and each mini-batch's reads made back (its block, or its pages);
    its folder removed after."""
    seeds = np.random.default_rng(1).permutation(np.asarray(store.train_store_ids))
    batches = [np.sort(seeds[k * batch_size:(k + 1) * batch_size]) for k in range(count)]
    work = WindowWork(1, 1, 1, 0, [b for b in batches if len(b)], None, config, scratch / "window")
    packer = Packer(spec)
    try:
        cpu, start = time.process_time(), time.perf_counter()
        stubs, scan, rows = packer.plan(work)
        plan_s, plan_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        scan_alone_s = 0.0
        if len(scan.rows):
            staging = packer.io.alloc(max(spec.staging_bytes, 2 * int(scan.lengths.max())))
            f = packer.io.open(store.features_path)
            try:
                start = time.perf_counter()
                for _ in packer.io.iter_rows(f, scan.rows, store.row_bytes, scan.offsets, scan.lengths, staging):
                    pass
                scan_alone_s = time.perf_counter() - start
            finally:
                packer.io.close(f)
        stubs, (report,) = packer.repack(work, stubs, scan, rows)
        blocks = sum(s.read.strategy is Strategy.BLOCK for s in stubs)
        back_s = sum(read_in_place(packer.io, work.directory / s.read.block if s.read.strategy is Strategy.BLOCK
                                   else store.features_path, s.read.offsets, s.read.lengths, 64 * MIB)
                     for s in stubs if len(s.read.offsets))
        back_bytes = sum(int(s.read.nbytes) for s in stubs)
    finally:
        packer.close()
        shutil.rmtree(work.directory, ignore_errors=True)
    writes_s = max(report.seconds - scan_alone_s, 1e-9)
    return {"minibatches": len(work.batches), "plans": len(stubs), "blocks": blocks,
            "plan_s": plan_s, "plan_cpu_s": plan_cpu_s, "scan_bytes": report.bytes_read,
            "scan_alone_s": scan_alone_s, "repack_s": report.seconds, "written_bytes": report.bytes_written,
            "write_bytes_per_s": report.bytes_written / writes_s if report.bytes_written else 0.0,
            "read_back_bytes": back_bytes, "read_back_s": back_s}


def reads_beside_writer(io: DirectIO, path: Path, scratch: Path, seconds: float) -> dict[str, float]:
    """1 MiB reads of `path` for `seconds` while a thread writes 64 MiB files to `scratch`
    (buffered, fsynced: as calibration's write measure) back to back: both rates."""
    done, written, spent = threading.Event(), [0], [0.0]

    def write() -> None:
        while not done.is_set():
            start = time.perf_counter()
            measure_write(scratch, 64 * MIB)
            spent[0] += time.perf_counter() - start
            written[0] += 64 * MIB

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    try:
        reads = measure_reads(io, path, MIB, seconds)
    finally:
        done.set()
        writer.join()
    write_bw = written[0] / spent[0] if spent[0] else 0.0
    return {"read_bytes_per_s": reads["bytes_per_s"], "write_bytes_per_s": write_bw,
            "bytes_per_s": reads["bytes_per_s"] + write_bw}


def bound(name: str, moved: float, bytes_per_s: float, memory_rate: float, seconds: float | None = None) -> dict:
    """One way's row: bytes moved per mini-batch, the drive's seconds for them (given, or
    at `bytes_per_s`), and the mini-batches a second that allows, beside memory mode's."""
    drive_s = seconds if seconds is not None else moved / bytes_per_s
    rate = 1 / drive_s
    return {"way": name, "moved_mb": moved / 1e6, "drive_s": drive_s, "batches_per_s_most": rate,
            "x_memory": rate / memory_rate}


def packed_apart(cold_bytes: float, write_bytes_per_s: float, read_bytes_per_s: float, memory_rate: float) -> dict:
    """The packed bound from above: each cold byte written once at the block writer's rate,
    then read once at the read rate, never beside each other, and no scan."""
    seconds = cold_bytes / write_bytes_per_s + cold_bytes / read_bytes_per_s
    return bound("packed apart (written once, read back once)", 2 * cold_bytes, 0.0, memory_rate, seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path)
    p.add_argument("--budget", default="153MiB", help="ssd.memory_budget (the hot cache it leaves)")
    p.add_argument("--beside-x", action="store_true", help="the budget beside the ssd loader's x arrays")
    p.add_argument("--batches", type=int, default=8, help="mini-batches measured after memory mode's first")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--window", type=int, default=10, help="mini-batches of the packer window timed")
    p.add_argument("--block-budget", default="auto", help="ssd.block_budget (the window's blocks take half)")
    p.add_argument("--seconds", type=float, default=2.0, help="each drive measure's duration")
    p.add_argument("--scratch", type=Path, default=None, help="where the writer writes (default: beside the store)")
    p.add_argument("--json", type=Path, default=Path("bench_out/read_arithmetic.json"))
    args = p.parse_args()
    store = Store.open(args.store)
    if args.window < 1:
        p.error(f"--window {args.window}: expected at least 1 mini-batch")
    hot, model, budget, split, spec = open_ssd(store, parse_bytes(args.budget), args.beside_x, args.batch_size,
                                               args.block_budget if args.block_budget == "auto"
                                               else parse_bytes(args.block_budget))
    print(f"store {args.store}: {store.num_nodes:,} rows of {store.row_bytes} B; {split}")
    first_s, memory_rate, inputs = memory_mode(store, args.batches, args.batch_size)
    per = []
    for rows in inputs:
        cold = np.setdiff1d(rows, hot.rows)
        plan = pages_plan(cold, store.row_bytes, model)
        per.append({"input_rows": len(rows), "cold_rows": len(cold), "cold_bytes": len(cold) * store.row_bytes,
                    "page_bytes": len(pages_of(cold, store.row_bytes)) * PAGE, "extent_bytes": int(plan.nbytes),
                    "extents": len(plan.offsets), "plan": plan})
    io = DirectIO(queue_depth=64)
    scratch = args.scratch or store.path
    try:
        for mb in per:
            mb["in_place_s"] = read_in_place(io, store.features_path, mb["plan"].offsets, mb["plan"].lengths, 64 * MIB)
            del mb["plan"]
        read = measure_reads(io, store.features_path, MIB, args.seconds)["bytes_per_s"]
        with tempfile.TemporaryDirectory(dir=scratch, prefix=".read_arithmetic.") as directory:
            mixed = reads_beside_writer(io, store.features_path, Path(directory), args.seconds)
            window = packed_window(*spec, store, args.window, args.batch_size, Path(directory))
    finally:
        io.shutdown()
    steady = per[1:] or per  # the first is memory mode's first mini-batch: its own row below
    mean = {key: float(np.mean([mb[key] for mb in steady])) for key in per[0]}
    ways = [bound("useful once (packed before training)", mean["cold_bytes"], read, memory_rate),
            bound("in place (planned extents, timed)", mean["extent_bytes"], read, memory_rate, mean["in_place_s"]),
            # the block writer's rate comes from a window that wrote blocks
            *([packed_apart(mean["cold_bytes"], window["write_bytes_per_s"], read, memory_rate)]
              if window["written_bytes"] else []),
            bound(f"packed, a window of {window['minibatches']} (scan, writes, reads back: timed)",
                  (window["scan_bytes"] + window["written_bytes"] + window["read_back_bytes"]) / window["minibatches"],
                  read, memory_rate, (window["repack_s"] + window["read_back_s"]) / window["minibatches"])]
    print(f"per mini-batch over {len(steady)}: input rows {mean['input_rows']:,.0f}, cold rows "
          f"{mean['cold_rows']:,.0f} ({mean['cold_bytes'] / 1e6:,.0f} MB), on {mean['page_bytes'] / 1e6:,.0f} MB of "
          f"pages, read by the planner as {mean['extents']:,.0f} extents of {mean['extent_bytes'] / 1e6:,.0f} MB")
    print(f"drive: 1 MiB reads {read / 1e6:,.0f} MB/s; beside a writer {mixed['read_bytes_per_s'] / 1e6:,.0f} read "
          f"+ {mixed['write_bytes_per_s'] / 1e6:,.0f} written = {mixed['bytes_per_s'] / 1e6:,.0f} MB/s")
    print(f"a packer's window of {window['minibatches']} mini-batches ({window['plans']} plans, {window['blocks']} "
          f"blocks): planned in {window['plan_s']:.2f} s ({window['plan_cpu_s']:.2f} CPU-s); its scan of "
          f"{window['scan_bytes'] / 1e6:,.0f} MB read alone in {window['scan_alone_s']:.2f} s, with the writes of "
          f"{window['written_bytes'] / 1e6:,.0f} MB in {window['repack_s']:.2f} s (the block writer at "
          f"{window['write_bytes_per_s'] / 1e6:,.0f} MB/s); read back {window['read_back_bytes'] / 1e6:,.0f} MB "
          f"in {window['read_back_s']:.2f} s")
    print(f"memory mode: {memory_rate:.3f} mini-batches/s, its first {first_s:.2f} s")
    print(f"{'way':40s} {'MB/mb':>8s} {'drive s':>8s} {'mb/s most':>10s} {'x memory':>9s}")
    for w in ways:
        print(f"{w['way']:40s} {w['moved_mb']:8,.0f} {w['drive_s']:8.3f} {w['batches_per_s_most']:10.3f} "
              f"{w['x_memory']:9.2f}")
    first_read = per[0]["in_place_s"]
    print(f"first mini-batch: its cold rows read in place take {first_read:.2f} s (after its sampling); "
          f"3x memory mode's first is {3 * first_s:.2f} s")
    result = {"meta": {"store": str(args.store), "budget": budget, "beside_x": args.beside_x, "split": split,
                       "batch_size": args.batch_size,
                       "batches": len(steady), "cpus": len(os.sched_getaffinity(0)),
                       "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
              "memory": {"batches_per_s": memory_rate, "first_batch_s": first_s},
              "drive": {"read_bytes_per_s": read, "beside_writer": mixed}, "window": window,
              "per_minibatch": per, "mean": mean, "ways": ways, "first_in_place_s": first_read}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json} ({format_bytes(args.json.stat().st_size)})")


if __name__ == "__main__":
    main()
