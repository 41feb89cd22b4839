"""Repack: one sequential pass over features.bin writes compact blocks for a window.

For each mega-batch of the window that the read planner gave a block, its read rows are
written back to back (ascending row order, i.e. its buffer slot order) into its own file,
padded to a page, so the loader reads it with a few large sequential requests straight
into the buffer. Blocks live only while their window is trained: `delete` drops them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from gnnssd.pipeline.block_writer import BlockWriter, row_lists
from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.pipeline.worker import check_stop
from gnnssd.sampler import CostModel, MegaBatchPlan, Scan, Strategy, windows


def repack(
    io: DirectIO,
    features_path: str | Path,
    row_bytes: int,
    plans: list[MegaBatchPlan],
    scan: Scan,
    block_dir: str | Path,
    staging_bytes: int = 32 << 20,
    writer_bytes: int = 16 << 20,
    within: np.ndarray | None = None,
) -> int:
    """Write the block files of the window's block plans; returns bytes written.
    Memory: the staging area and `writer_bytes` of write chunks, and the blocks' row lists
    in one array unless their read rows are views of `within` (block_writer.row_lists). In
    a closing PlanWorker's thread it raises Stopped between staging chunks (the caller
    removes the blocks)."""
    # blocks in the order their last rows come in the scan, each closed once it has them:
    # at most `overlap` blocks then hold a write chunk at once (see open_at_once)
    blocks = sorted((p for p in plans if p.read is not None and p.read.strategy is Strategy.BLOCK),
                    key=lambda p: int(p.read_rows[-1]) if p.num_read else -1)
    if not blocks:
        return 0
    block_dir = Path(block_dir)
    block_dir.mkdir(parents=True, exist_ok=True)
    union = scan.rows
    staging = io.alloc(max(staging_bytes, 2 * int(scan.lengths.max())))
    f = io.open(features_path)
    try:
        with BlockWriter([block_dir / p.read.block for p in blocks], row_bytes, io.alloc,
                         writer_bytes, open_at_once=overlap(blocks), rows=[p.num_read for p in blocks]) as writer:
            rows, starts, ends = row_lists([p.read_rows for p in blocks], within)
            cursor = np.zeros(len(blocks), np.int64)  # the rows of each block appended so far
            for lo, hi, pos in io.iter_rows(f, union, row_bytes, scan.offsets, scan.lengths, staging):
                check_stop()  # a closing worker stops here, not at the window's end
                if hi > lo:  # every block's rows up to the chunk's last, in one kernel call
                    writer.append_sorted(staging, union[lo:hi], pos, rows, starts, ends, cursor, int(union[hi - 1]))
    finally:
        io.close(f)
    return writer.bytes_written


def overlap(plans: list[MegaBatchPlan]) -> int:
    """The most plans whose read-row ranges [first, last] share a row. Appending in scan
    order, each plan's block closed as soon as its last row is in and a scan chunk's blocks
    taken in the order of their last rows, no more blocks than this are open at once: a
    block opened in chunk c shares with every open one the scan chunk's last row (or its
    own last row, if it ends in c)."""
    plans = [p for p in plans if p.num_read]
    if not plans:
        return 1
    first = np.sort([int(p.read_rows[0]) for p in plans])
    last = np.sort([int(p.read_rows[-1]) for p in plans])
    # open at each first row: those begun at or before it, less those ended before it
    return int((np.arange(1, len(first) + 1) - np.searchsorted(last, first, "left")).max())


def block_path(plan: MegaBatchPlan, block_dir: str | Path | None) -> Path | None:
    """The compact block file of `plan` in `block_dir`, or None if it reads pages."""
    if plan.read is None or plan.read.strategy is not Strategy.BLOCK:
        return None
    return Path(block_dir) / plan.read.block


def plan_files(plan: MegaBatchPlan, block_dir: str | Path | None) -> list[Path]:
    """The files a loaded plan leaves: its spill file and its compact block, if any."""
    return [f for f in (Path(plan.spill_path) if plan.spill_path else None, block_path(plan, block_dir))
            if f is not None]


def delete(plan: MegaBatchPlan, block_dir: str | Path | None) -> None:
    """Delete a trained plan's files (the one way the loader and benchmarks drop them)."""
    for f in plan_files(plan, block_dir):
        f.unlink(missing_ok=True)


@dataclass(frozen=True)
class RepackReport:
    """What repacking one window cost."""

    seconds: float
    bytes_read: int
    requests: int
    bytes_written: int


def repacked_windows(
    plans: Iterable[MegaBatchPlan],
    io: DirectIO,
    features_path: str | Path,
    row_bytes: int,
    model: CostModel,
    disk_budget: int,
    block_dir: str | Path,
    staging_bytes: int = 32 << 20,
    writer_bytes: int = 16 << 20,
    report: Callable[[RepackReport], None] | None = None,
    uses: int = 1,
) -> Iterator[list[MegaBatchPlan]]:
    """Plans grouped into windows with their reads planned (for `uses` reads of each: see
    readplan.choose_window) and their blocks written; `report` hears each window's repack
    cost.

    Run it in a PlanWorker of depth 2 and `delete` each window's plans once trained: at most two
    windows of blocks (each within half the budget) are then on disk."""
    for window, scan in windows(plans, row_bytes, model, disk_budget, uses):
        cost = repack_window(io, features_path, row_bytes, window, scan, block_dir, staging_bytes, writer_bytes)
        if report is not None:
            report(cost)
        yield window


def repack_window(io: DirectIO, features_path: str | Path, row_bytes: int, window: list[MegaBatchPlan], scan: Scan,
                  block_dir: str | Path, staging_bytes: int, writer_bytes: int,
                  within: np.ndarray | None = None) -> RepackReport:
    """`repack` of a window whose reads are chosen (readplan.choose_window), and what it cost."""
    start = time.perf_counter()
    written = repack(io, features_path, row_bytes, window, scan, block_dir, staging_bytes, writer_bytes, within)
    return RepackReport(time.perf_counter() - start, int(scan.lengths.sum()), len(scan.lengths), written)
