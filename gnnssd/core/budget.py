"""One memory budget for the out-of-core trainer, split between its four consumers.

Policy (in this order, because each part can give way less than the next):

1. Mega-batch buffers: `buffers` buffers of `buffer_rows` rows each (the caller's count:
   the ssd loader's is pipeline.buffers.BUFFERS, the one being trained on plus the one being
   filled). Training cannot run without them, so they are taken first, in full.
2. Queue slack: `queue_bytes` for everything else in flight (the I/O staging area and the
   queues of planned mini-batches). Also taken in full.
3. Held arrays: `held_bytes` the loader's consumer holds (the ssd loader's recycled x
   arrays), taken before the hot cache (`ssd_split` sizes the buffers from what is left
   after them, so buffers and hot cache give way in proportion). Where the buffers' least
   and the queues leave no room for them, the budget is exceeded by the rest (a negative
   `spare`, logged) rather than refused: their size is an estimate from sampled
   mini-batches.
4. Hot cache: what is left, up to the `hot_rows` wanted. It is an optimisation: a smaller
   hot cache only means more reads, so it shrinks instead of failing. Bytes the hot
   cache does not want are reported as `spare`.

A budget that cannot hold 1 and 2 is refused with a ValueError that names the largest
mega-batch buffer that would fit and the smallest budget that would hold this one.
The caller decides `buffer_rows`: the ssd loader by `ssd_split` (enough for the largest
sampled mini-batch with a margin, or its share of the budget); the planner then cuts
mega-batches so that none needs more buffer rows than that. Nothing here re-plans or
re-splits.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Callable

UNITS = {"": 1, "b": 1,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
ACCEPTED = "a non-negative integer of bytes or a number with a unit: B, KiB, MiB, GiB, TiB " \
           "(powers of 1024) or KB, MB, GB, TB (powers of 1000), e.g. '1.25GiB' or '512MiB'"
log = logging.getLogger("gnnssd.ssd")

DEFAULT_QUEUE_BYTES = 64 << 20
AUTO = "auto"  # ssd.block_budget chosen by auto_block_budget
AUTO_MIN_RATIO = 2  # features at most this many times the memory budget: no blocks
#: Blocks want the features' size: a window's scan reads most of the features file whatever
#: the window's size, so windows of half the block budget share it among twice the
#: mini-batches they did at half the features' size (medium at 1/8, one packer: bytes read
#: per useful byte 4.34 -> 3.0, ~1.3x the rate). Twice the size read less still, but the
#: windows' plan stubs (counted in the memory budget) left two packers' trainer buffers
#: too small at 1/8: docs/BENCHMARKS.md, issue 46, fifth round. That holds where the
#: trainer's own thread repacks (ssd.packers 0).
AUTO_FEATURE_SHARE = 1.0
#: With packers, a window's rows wait in mapped files (gnnssd.pipeline.packers.RowsFile),
#: so the memory budget no longer grows with the window: windows of 1.5x the features
#: share each scan among 3x the mini-batches (medium at 1/8, one packer, 120 mini-batches:
#: 707 -> 529 MB moved a mini-batch, 1.35x the rate; docs/BENCHMARKS.md, issue 46, seventh
#: round).
PACKED_FEATURE_SHARE = 3.0
AUTO_DISK_SHARE = 0.25  # and never more than a quarter of the free space under the run dir


def parse_bytes(value: int | str) -> int:
    """A size in bytes from an int or a string such as '1.25GiB', '512MiB' or '2GB'
    (rounded down to whole bytes)."""
    if isinstance(value, bool):
        raise ValueError(f"size {value!r}: expected {ACCEPTED}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size {value!r} is negative; expected {ACCEPTED}")
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else None
    if match is None or unit not in UNITS:
        raise ValueError(f"size {value!r}: expected {ACCEPTED}")
    return int(Decimal(match.group(1)) * UNITS[unit])


def exact_size(n: int) -> int | str:
    """n as the config file would say it, when a binary unit divides it ('3GiB' for
    3 * 2**30), else the int itself: what parse_bytes reads back to exactly n."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return n


def format_bytes(n: int | float) -> str:
    """n bytes in the largest binary unit that keeps the number >= 1, e.g. '1.25 GiB'."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class MemoryBudget:
    """How `total` bytes are split (see the module docstring for the policy)."""

    total: int
    row_bytes: int
    hot_rows: int           # rows the hot cache gets (may be fewer than wanted)
    hot_rows_wanted: int
    buffer_rows: int        # rows per mega-batch buffer
    buffers: int            # mega-batch buffers
    queue_bytes: int
    held_bytes: int = 0     # arrays the consumer holds (the x arrays), taken before the hot cache

    @classmethod
    def split(cls, total: int, row_bytes: int, hot_rows: int, buffer_rows: int, buffers: int,
              queue_bytes: int = DEFAULT_QUEUE_BYTES, held_bytes: int = 0) -> MemoryBudget:
        """Split `total` bytes or raise a ValueError saying what fits."""
        for name, value, least in (("row_bytes", row_bytes, 1), ("hot_rows", hot_rows, 0),
                                   ("buffer_rows", buffer_rows, 1),
                                   ("buffers", buffers, 1),
                                   ("queue_bytes", queue_bytes, 0)):
            if value < least:
                raise ValueError(f"{name} = {value}; expected at least {least}")
        needed = buffers * buffer_rows * row_bytes + queue_bytes
        if needed > total:
            largest = max(0, (total - queue_bytes) // (buffers * row_bytes))
            raise ValueError(
                f"memory_budget {format_bytes(total)} cannot hold {buffers} mega-batch buffers "
                f"of {buffer_rows:,} rows x {row_bytes} B ({format_bytes(buffers * buffer_rows * row_bytes)}) "
                f"plus {format_bytes(queue_bytes)} of queues: the largest mega-batch buffer that "
                f"fits is {largest:,} rows (use fewer mini-batches per mega-batch), or raise "
                f"memory_budget to at least {format_bytes(needed)} "
                f"({needed} bytes)")
        granted = max(0, min(hot_rows, (total - needed - held_bytes) // row_bytes))
        return cls(total, row_bytes, granted, hot_rows, buffer_rows, buffers, queue_bytes, held_bytes)

    @property
    def hot_bytes(self) -> int:
        return self.hot_rows * self.row_bytes

    @property
    def buffer_bytes(self) -> int:
        """Bytes of all mega-batch buffers together."""
        return self.buffers * self.buffer_rows * self.row_bytes

    @property
    def spare_bytes(self) -> int:
        """What the budget leaves unused; negative: the held arrays exceed it by that much."""
        return self.total - self.hot_bytes - self.buffer_bytes - self.queue_bytes - self.held_bytes

    def describe(self) -> str:
        """One line for the log: the split the trainer runs with."""
        shrunk = (f" of {self.hot_rows_wanted:,} wanted" if self.hot_rows < self.hot_rows_wanted
                  else "")
        return (f"memory_budget {format_bytes(self.total)}: hot cache {format_bytes(self.hot_bytes)} "
                f"({self.hot_rows:,} rows{shrunk}), {self.buffers} mega-batch buffers x "
                f"{format_bytes(self.buffer_rows * self.row_bytes)} ({self.buffer_rows:,} rows), "
                f"queues {format_bytes(self.queue_bytes)}, x arrays {format_bytes(self.held_bytes)}, "
                + (f"spare {format_bytes(self.spare_bytes)}" if self.spare_bytes >= 0 else
                   f"over by {format_bytes(-self.spare_bytes)} (the x arrays do not fit beside the buffers "
                   "and queues: raise memory_budget)"))


#: Buffer rows per sampled mini-batch's cold rows: mini-batches vary.
MINIBATCH_MARGIN = 1.5
#: Smaller buffers would stream a mini-batch in too many pieces.
MIN_BUFFER_BYTES = 1 << 20


def ssd_split(total: int, row_bytes: int, queue_bytes: int, hot_fraction: float, num_rows: int, buffers: int,
              cold_rows_per_minibatch: Callable[[int], int], held_bytes: int = 0) -> MemoryBudget:
    """The ssd loader's split of `total` bytes beside `queue_bytes` of queues and staging
    and `held_bytes` of x arrays (see the module docstring): `buffers` buffers of cold
    rows (hot rows are gathered from the hot cache) take (1 - hot_fraction) of what is
    left, or more when a sampled mini-batch's cold rows
    (`cold_rows_per_minibatch(hot_count)` with the `hot_count` hottest rows cached, times
    MINIBATCH_MARGIN) need more and fit, and hold them still beside the smaller hot cache
    they leave; the hot cache the rest, up to `num_rows`. A
    mini-batch larger than a buffer is streamed in pieces (the planner), so the least that
    works is `buffers` buffers of MIN_BUFFER_BYTES: a smaller budget is a ValueError naming
    the least one."""
    usable = max(total - queue_bytes, 0)
    least_rows = max(1, MIN_BUFFER_BYTES // row_bytes)
    if buffers * least_rows * row_bytes > usable:
        least = buffers * least_rows * row_bytes + queue_bytes
        raise ValueError(f"{format_bytes(total)} is too small: {format_bytes(queue_bytes)} of queues and "
                         f"staging plus {buffers} buffers of at least {least_rows:,} rows of {row_bytes} B "
                         f"need at least {format_bytes(least)} ({least} bytes); raise memory_budget")
    room = max(usable - held_bytes, buffers * least_rows * row_bytes)  # for the buffers and the hot cache
    share = max(int(room * (1 - hot_fraction)) // (buffers * row_bytes), least_rows)

    def cold_beside(rows: int) -> int:
        """A sampled mini-batch's cold rows beside buffers of `rows` (the hot cache they leave)."""
        return cold_rows_per_minibatch(min(num_rows, room // row_bytes - buffers * rows))

    needed = int(MINIBATCH_MARGIN * cold_beside(share))
    # grown buffers shrink the hot cache, which grows a mini-batch's cold rows: grown only
    # where they still hold those (medium at 1/2 of its features: buffers grown for the
    # cold rows beside the share's hot cache left 0.5% of it, and the mini-batches, colder
    # by as much, were read in pieces all the same)
    grow = share < needed <= room // (buffers * row_bytes) and cold_beside(needed) <= needed
    buffer_rows = needed if grow else share
    if buffer_rows < needed:
        log.info("a buffer holds %s rows, fewer than a mini-batch's ~%s cold rows: larger "
                 "mini-batches are read in pieces", f"{buffer_rows:,}", f"{needed:,}")
    return MemoryBudget.split(total, row_bytes, hot_rows=min(num_rows, usable // row_bytes),
                              buffer_rows=buffer_rows, buffers=buffers, queue_bytes=queue_bytes,
                              held_bytes=held_bytes)


def auto_block_budget(feature_bytes: int, memory_budget: int, disk: os.statvfs_result,
                      share: float = AUTO_FEATURE_SHARE) -> int:
    """`ssd.block_budget: auto`: disk space for compact blocks, from the features-to-budget
    ratio and `disk` (os.statvfs of the block directory's filesystem).

    0 (extents only) when the features are at most AUTO_MIN_RATIO times the memory budget
    (the hot cache holds much of them: repacking costs more than it saves); otherwise
    `share` of the features (AUTO_FEATURE_SHARE, or PACKED_FEATURE_SHARE with packers),
    capped at AUTO_DISK_SHARE of the free space, and 0 when that cap is below the memory
    budget (windows smaller than a buffer repack nothing worth the write: the disk is too
    full)."""
    if feature_bytes <= AUTO_MIN_RATIO * memory_budget:
        return 0
    free = disk.f_bavail * disk.f_frsize
    chosen = min(int(feature_bytes * share), int(free * AUTO_DISK_SHARE))
    return chosen if chosen >= memory_budget else 0


def filesystem(directory: Path) -> tuple[Path, os.statvfs_result]:
    """`directory`, or its nearest existing parent, and the statvfs of its filesystem."""
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    return existing, os.statvfs(existing)


def disk_share(directory: Path) -> int:
    """AUTO_DISK_SHARE of the free space on `directory`'s filesystem: the most the block
    budget, or an epoch kept for reuse, may take there."""
    disk = filesystem(directory)[1]
    return int(disk.f_bavail * disk.f_frsize * AUTO_DISK_SHARE)


def resolve_block_budget(value: int | str, feature_bytes: int, memory_budget: int,
                         directory: Path, share: float = AUTO_FEATURE_SHARE) -> tuple[int, str]:
    """The block budget in bytes for `value` (bytes, or AUTO decided for `directory`'s
    filesystem, or its nearest existing parent's: auto_block_budget's `share`), and a line
    saying why, for the log."""
    if value != AUTO:
        return value, f"ssd.block_budget {format_bytes(value)} (as configured)"
    existing, disk = filesystem(directory)
    chosen = auto_block_budget(feature_bytes, memory_budget, disk, share)
    return chosen, (f"ssd.block_budget auto: {format_bytes(chosen)} (features "
                    f"{feature_bytes / memory_budget:.1f}x the memory budget; "
                    f"{format_bytes(disk.f_bavail * disk.f_frsize)} free under {existing})")
