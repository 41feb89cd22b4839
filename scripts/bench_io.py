#!/usr/bin/env python3
"""Benchmark gnnssd.io_engine against fio on the same file, block size and queue depth.

Each row runs fio and the engine for the same fixed duration, interleaved in one process
run (fio, engine, engine, fio, repeated; medians) on one O_DIRECT file of --size-gib GiB
of random bytes. Rows: random 4 KiB reads at depth 1, 32, 128; random 64 KiB at depth
32; sequential 1 MiB at depth 16; the thread-pool fallback against fio's psync with as
many threads; and the row readers on 512-byte rows (one page per row versus coalesced
extents) in useful bytes/s, against fio's random 4 KiB at depth 128 counted the same way
(512 useful bytes a read).

    python scripts/bench_io.py [--quick] [--json PATH] [--dir DIR] [--keep]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from gnnssd.io_engine import Engine
from gnnssd.sampler.readplan import CostModel, per_row_requests, plan_extents

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
ROW_BYTES = 512
T = TypeVar("T")


@dataclass
class Row:
    name: str
    fio: float
    engine: float
    unit: str
    ratio: float
    note: str = ""
    # CPU time per read of each whole process (fio's own figure; the engine's includes
    # Python): a check that does not depend on what else the shared machine is doing
    fio_cpu_us_per_io: float | None = None
    engine_cpu_us_per_io: float | None = None


@dataclass(frozen=True)
class Job:
    name: str
    rw: str      # "randread" or "read" (sequential)
    bs: int
    depth: int
    backend: str  # engine backend; "threads" is compared with fio psync x depth threads


JOBS = [
    Job("randread 4KiB qd1", "randread", 4 * KiB, 1, "io_uring"),
    Job("randread 4KiB qd32", "randread", 4 * KiB, 32, "io_uring"),
    Job("randread 4KiB qd128", "randread", 4 * KiB, 128, "io_uring"),
    Job("randread 64KiB qd32", "randread", 64 * KiB, 32, "io_uring"),
    Job("seqread 1MiB qd16", "read", MiB, 16, "io_uring"),
    Job("threads: randread 4KiB qd32", "randread", 4 * KiB, 32, "threads"),
    Job("threads: randread 64KiB qd32", "randread", 64 * KiB, 32, "threads"),
    Job("threads: seqread 1MiB qd16", "read", MiB, 16, "threads"),
]


def make_file(path: Path, size: int) -> None:
    """Random bytes (no sparse or zero pages a virtual disk could shortcut), then synced."""
    if path.exists() and path.stat().st_size == size:
        return
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for start in range(0, size, 64 * MiB):
            f.write(rng.bytes(min(64 * MiB, size - start)))
        f.flush()
        os.fsync(f.fileno())


def run_fio(path: Path, job: Job, seconds: float) -> tuple[float, float, float]:
    """(IOPS, bytes/s, CPU s per read) of fio reading path with job's pattern."""
    cmd = ["fio", "--name=bench", f"--filename={path}", "--direct=1", f"--rw={job.rw}",
           f"--bs={job.bs}", "--time_based", f"--runtime={seconds}s", "--norandommap",
           "--randrepeat=0", "--output-format=json", "--group_reporting"]
    if job.backend == "threads":
        cmd += ["--ioengine=psync", f"--numjobs={job.depth}", "--thread"]
    else:
        cmd += ["--ioengine=io_uring", f"--iodepth={job.depth}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    stats = json.loads(out[out.index("{"):])["jobs"][0]
    iops = float(stats["read"]["iops"])
    # usr/sys_cpu: percent of one CPU over the run (of one job)
    cpu = (stats["usr_cpu"] + stats["sys_cpu"]) / 100 * seconds
    return iops, float(stats["read"]["bw_bytes"]), cpu / max(iops * seconds, 1.0)


def run_engine(path: Path, job: Job, seconds: float) -> tuple[float, float, float]:
    """(IOPS, bytes/s, CPU s per read) of the engine: batches of requests, two in flight so
    the queue never drains between batches, for `seconds`."""
    rng = np.random.default_rng(1)
    with Engine(backend=job.backend, queue_depth=job.depth) as eng, eng.open(path) as f:
        blocks = f.size // job.bs
        batch = int(np.clip(job.depth * 256, 1024, 32768))
        slots = max(2 * job.depth, 64)
        buf = eng.alloc(slots * job.bs)
        dests = (np.arange(batch, dtype=np.int64) % slots) * job.bs
        lengths = np.full(batch, job.bs, dtype=np.int64)
        pos, done, pending = 0, 0, []
        cpu0, start = _cpu_seconds(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            if job.rw == "randread":
                idx = rng.integers(0, blocks, batch)
            else:
                idx = (pos + np.arange(batch)) % blocks
                pos = (pos + batch) % blocks
            pending.append(eng.submit(f, idx * job.bs, lengths, buf, dests))
            if len(pending) == 2:
                pending.pop(0).wait()
                done += batch
        for h in pending:
            h.wait()
            done += batch
        elapsed, cpu = time.perf_counter() - start, _cpu_seconds() - cpu0
    return done / elapsed, done * job.bs / elapsed, cpu / done


def _cpu_seconds() -> float:
    t = os.times()  # this process, all threads
    return t.user + t.system


def run_rows(path: Path, density: float, coalesced: bool, window_rows: int,
             seconds: float) -> float:
    """Useful bytes/s of reading 512-byte rows: each call takes `density` of the rows of
    a random window (a mega-batch's union), shuffled, and reads them with the engine's row
    reader by the read planner's extents: one request per row, or merged by the default
    cost model."""
    rng = np.random.default_rng(2)
    model = CostModel.default()
    with Engine(queue_depth=128) as eng, eng.open(path) as f:
        n_rows = f.size // ROW_BYTES
        staging = eng.alloc(2 * eng.chunk_bytes)
        useful, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            first = int(rng.integers(0, n_rows - window_rows + 1))
            rows = first + np.flatnonzero(rng.random(window_rows) < density)
            rng.shuffle(rows)
            ordered = np.sort(rows)
            offsets, lengths = (plan_extents(ordered, ROW_BYTES, model)[:2] if coalesced
                                else per_row_requests(ordered, ROW_BYTES))
            eng.read_rows(f, rows, ROW_BYTES, offsets, lengths, staging=staging)
            useful += len(rows) * ROW_BYTES
        return useful / (time.perf_counter() - start)


def interleave(fns: list[Callable[[float], T]], seconds: float, rounds: int) -> list[T]:
    """Run fns in order then reversed (A B B A), `rounds` times, each run seconds/2/rounds,
    and take each fn's median: the machine is shared, and this way a change in its other
    load weighs on every side alike."""
    runs: list[list[T]] = [[] for _ in fns]
    span = seconds / (2 * rounds)
    for _ in range(rounds):
        for i in [*range(len(fns)), *reversed(range(len(fns)))]:
            runs[i].append(fns[i](span))
    return [_median(r) for r in runs]


def _median(xs: list[T]) -> T:
    if isinstance(xs[0], tuple):  # rate tuples: the run with the median first element
        return sorted(xs, key=lambda x: x[0])[len(xs) // 2]  # type: ignore[index]
    return sorted(xs)[len(xs) // 2]  # type: ignore[type-var]


def bench(path: Path, seconds: float, rounds: int, window_rows: int) -> list[Row]:
    rows: list[Row] = []
    for job in JOBS:
        (fio_iops, fio_bw, fio_cpu), (eng_iops, eng_bw, eng_cpu) = interleave(
            [lambda t: run_fio(path, job, t), lambda t: run_engine(path, job, t)],
            seconds, rounds)
        # fio reports CPU per thread, not per process, for its psync thread pool
        cpu = ({} if job.backend == "threads" else
               {"fio_cpu_us_per_io": fio_cpu * 1e6, "engine_cpu_us_per_io": eng_cpu * 1e6})
        if job.bs < 64 * KiB:
            rows.append(Row(job.name, fio_iops, eng_iops, "IOPS", eng_iops / fio_iops, **cpu))
        else:
            rows.append(Row(job.name, fio_bw / 1e9, eng_bw / 1e9, "GB/s", eng_bw / fio_bw,
                            **cpu))
        print(_fmt(rows[-1]), flush=True)
    fio_4k = next(j for j in JOBS if j.name == "randread 4KiB qd128")
    for density in (0.05, 0.20):
        fio_useful, per_page, coalesced = interleave(
            [lambda t: run_fio(path, fio_4k, t)[0] * ROW_BYTES / 1e9,
             lambda t: run_rows(path, density, False, window_rows, t) / 1e9,
             lambda t: run_rows(path, density, True, window_rows, t) / 1e9],
            seconds, rounds)
        for kind, useful in (("one page per row", per_page), ("coalesced extents", coalesced)):
            rows.append(Row(f"rows 512B {density:.0%} dense, {kind}", fio_useful, useful,
                            "useful GB/s", useful / fio_useful,
                            "fio column: fio 4KiB qd128 x 512 useful bytes per read"))
            print(_fmt(rows[-1]), flush=True)
    return rows


def _fmt(r: Row) -> str:
    line = f"{r.name:<40} {r.fio:>12.4g} {r.engine:>12.4g} {r.unit:<12} {r.ratio:>6.2f}"
    if r.fio_cpu_us_per_io is not None:
        line += f"   cpu us/io fio {r.fio_cpu_us_per_io:.2f} engine {r.engine_cpu_us_per_io:.2f}"
    return line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 GiB file, 4 s per side and row")
    p.add_argument("--json", type=Path, default=Path("bench_out/bench_io.json"),
                   help="where to write {'rows': [...]} (default: %(default)s)")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="directory for the test file; must be on the disk to measure")
    p.add_argument("--size-gib", type=float, help="file size (default 4, --quick 1)")
    p.add_argument("--seconds", type=float,
                   help="per side and row, all rounds (default 12, --quick 4)")
    p.add_argument("--rounds", type=int, help="fio/engine alternations (default 3, --quick 2)")
    p.add_argument("--keep", action="store_true", help="keep the test file afterwards")
    args = p.parse_args()
    if shutil.which("fio") is None:
        print("fio is not installed: `make bench` installs it (apt-get install fio)",
              file=sys.stderr)
        return 2
    size = int((args.size_gib or (1 if args.quick else 4)) * GiB) // MiB * MiB
    seconds = args.seconds or (4.0 if args.quick else 12.0)
    rounds = args.rounds or (2 if args.quick else 3)
    window_rows = (1 << 18) if args.quick else (1 << 20)
    path = args.dir / "gnnssd_bench_io.bin"
    print(f"file {path}: {size / GiB:g} GiB, {seconds:g} s per side and row in {rounds} "
          "rounds", flush=True)
    make_file(path, size)
    try:
        print(f"{'name':<40} {'fio':>12} {'engine':>12} {'unit':<12} {'ratio':>6}")
        rows = bench(path, seconds, rounds, window_rows)
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    meta = {"file_bytes": size, "seconds": seconds, "rounds": rounds, "kernel": platform.release(),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows], "meta": meta},
                                    indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
