"""Read planner: turn the rows a mega-batch must read into requests, by a drive cost model.

The model: at queue depth, a batch of requests takes `requests * request_s + bytes / read_bw`
(request-bound for small reads, bandwidth-bound for large ones). Two page runs are merged
when reading the gap between them costs less than one more request. The alternative to
page reads is a compact block (see repack.py): the rows written contiguously by a
sequential scan, then read back sequentially; it pays a share of the scan plus a write and
a read of exactly the rows, and is chosen per mega-batch when the model says it is cheaper.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numba as nb
import numpy as np

from gnnssd.storage_format import PAGE, atomic_write_json, read_small_json

from . import bitset


@dataclass(frozen=True)
class CostModel:
    request_s: float  # fixed cost of one request at depth, beyond its transfer time
    read_bw: float  # bytes/s of large reads
    write_bw: float  # bytes/s of large buffered writes + fsync (repack)
    page: int = PAGE
    max_request: int = 1 << 20  # longer extents are split to keep the queue full

    @classmethod
    def default(cls) -> "CostModel":
        """A development drive measured with fio: 61k IOPS of 4 KiB at depth 64, 1.1 GB/s
        sequential (used until `gnnssd calibrate` measures the actual drive)."""
        return cls(request_s=1 / 61e3 - PAGE / 1.1e9, read_bw=1.1e9, write_bw=1.0e9)

    def read_time(self, lengths: np.ndarray) -> float:
        return len(lengths) * self.request_s + float(np.sum(lengths)) / self.read_bw

    def sequential_time(self, nbytes: int) -> float:
        """Large sequential read of nbytes (requests of max_request)."""
        return -(-nbytes // self.max_request) * self.request_s + nbytes / self.read_bw

    def max_extent(self, row_bytes: int) -> int:
        """Longest extent plan_extents makes: max_request plus the pages of one row that
        straddles the limit (a row is never split between requests)."""
        return self.max_request + (-(-row_bytes // self.page) + 1) * self.page

    @property
    def gap_pages(self) -> int:
        """Largest gap (pages) cheaper to read through than to skip with a new request."""
        return int(self.request_s * self.read_bw // self.page)

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """Written into the store it was measured on (calibration.json)."""
        atomic_write_json(Path(path), {"model": asdict(self), **(extra or {})}, into_store=True)

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        return cls(**read_small_json(path, what="calibration file")["model"])


class Strategy(str, Enum):
    """Where a mega-batch's read rows come from: extents of features.bin, or the compact
    block file its rows were repacked into."""

    PAGES = "pages"
    BLOCK = "block"


@dataclass
class ReadPlan:
    """How one mega-batch's read rows come from disk."""

    strategy: Strategy  # a Strategy's value is accepted too (a plan loaded from disk)
    offsets: np.ndarray  # int64 request offsets in the file read
    lengths: np.ndarray  # int64 request lengths
    pages: int  # distinct features.bin pages holding the rows
    predicted_s: float  # model time, including this mega-batch's share of the repack scan
    block: str = ""  # block file name (Strategy.BLOCK)

    def __post_init__(self) -> None:
        self.strategy = Strategy(self.strategy)

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())

    def to_arrays(self) -> dict[str, np.ndarray]:
        meta = json.dumps({"strategy": self.strategy.value, "pages": self.pages, "predicted_s": self.predicted_s, "block": self.block})
        return {"offsets": self.offsets, "lengths": self.lengths, "meta": np.frombuffer(meta.encode(), np.uint8)}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> "ReadPlan":
        return cls(offsets=a["offsets"], lengths=a["lengths"], **json.loads(a["meta"].tobytes().decode()))

    def equals(self, other: "ReadPlan") -> bool:
        return (
            (self.strategy, self.pages, self.predicted_s, self.block) == (other.strategy, other.pages, other.predicted_s, other.block)
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.lengths, other.lengths)
        )


@nb.njit(cache=True)
def _extents(rows, row_bytes, page, gap_pages, max_pages):
    n = rows.shape[0]
    start = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    m = 0
    pages = 0
    for i in range(n):
        p0 = rows[i] * row_bytes // page
        p1 = ((rows[i] + 1) * row_bytes - 1) // page + 1
        if m > 0 and p0 < end[m - 1]:  # shares a page with the previous row
            pages += max(0, p1 - end[m - 1])
            if p1 - start[m - 1] <= max_pages or p0 == start[m - 1]:  # (a new extent would
                end[m - 1] = max(end[m - 1], p1)  # start on the same page: extend this one)
            else:  # past the request limit: a new extent, re-reading the shared page
                start[m] = p0
                end[m] = p1
                m += 1
        elif m > 0 and p0 - end[m - 1] <= gap_pages and p1 - start[m - 1] <= max_pages:
            pages += p1 - p0
            end[m - 1] = p1
        else:
            pages += p1 - p0
            start[m] = p0
            end[m] = p1
            m += 1
    return start[:m] * page, (end[:m] - start[:m]) * page, pages


def plan_extents(rows: np.ndarray, row_bytes: int, model: CostModel, merge: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """Page-aligned extents covering sorted `rows`: (offsets, lengths, distinct pages).

    Extents are sorted; two overlap (by one page) only where a row straddling the request
    limit starts a new extent on the page its predecessor ends on.

    merge=False gives one request per page run without gap merging or length limit."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    gap = model.gap_pages if merge else 0
    max_pages = max(model.max_request // model.page, 1) if merge else np.iinfo(np.int64).max
    return _extents(rows, row_bytes, model.page, gap, max_pages)


def per_row_requests(rows: np.ndarray, row_bytes: int, page: int = PAGE) -> tuple[np.ndarray, np.ndarray]:
    """One request per row for the pages holding it (the Ginex/GraphBolt baseline)."""
    rows = np.asarray(rows, dtype=np.int64)
    first = rows * row_bytes // page
    last = ((rows + 1) * row_bytes - 1) // page + 1
    return first * page, (last - first) * page


def pages_plan(rows: np.ndarray, row_bytes: int, model: CostModel) -> ReadPlan:
    offsets, lengths, pages = plan_extents(rows, row_bytes, model)
    return ReadPlan(Strategy.PAGES, offsets, lengths, pages, model.read_time(lengths))


def block_bytes(num_rows: int, row_bytes: int, page: int = PAGE) -> int:
    """Size of a compact block file: the rows back to back, padded to a page."""
    return -(-num_rows * row_bytes // page) * page


def block_requests(nbytes: int, model: CostModel) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.arange(0, nbytes, model.max_request, dtype=np.int64)
    return offsets, np.minimum(model.max_request, nbytes - offsets)


@dataclass
class Scan:
    """A window's repack pass: the rows its blocks hold (sorted, unique) and the extents of
    features.bin that cover them."""

    rows: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    @classmethod
    def empty(cls) -> "Scan":
        return cls(*(np.empty(0, np.int64) for _ in range(3)))


def choose_window(plans: list, row_bytes: int, model: CostModel, disk_budget: int, uses: int = 1,
                  union_into: Callable[[int], np.ndarray] | None = None) -> Scan:
    """Set `plan.read` for a window of mega-batch plans; returns the repack scan.

    A mega-batch is a block candidate when writing and reading back its rows costs less
    than its page reads; the candidates (largest saving first, within `disk_budget`) are
    repacked together when their summed saving pays for the scan that collects their rows.
    Returns an empty scan when no mega-batch of the window gets a block. A plan whose page
    reads are planned already (`plan.read`, strategy "pages") keeps them. With `uses` > 1
    the plans are read that many times (epochs reusing their samples) while the scan and
    the writes happen once. A block plan's predicted_s is its time per use.
    """
    page_plans = [p.read if p.read is not None and p.read.strategy == "pages"  # planned already
                  else pages_plan(p.read_rows, row_bytes, model) for p in plans]
    write_s, read_s, saving = [], [], []
    for p, pp in zip(plans, page_plans):
        nbytes = block_bytes(p.num_read, row_bytes)
        write_s.append(nbytes / model.write_bw)
        read_s.append(model.read_time(block_requests(nbytes, model)[1]))
        saving.append(uses * (pp.predicted_s - read_s[-1]) - write_s[-1])
    chosen, used = [], 0
    for i in np.argsort(saving)[::-1]:
        nbytes = block_bytes(plans[i].num_read, row_bytes)
        if saving[i] > 0 and used + nbytes <= disk_budget:
            chosen.append(int(i))
            used += nbytes
    scan = Scan.empty()
    if chosen:
        union = sorted_union([plans[i].read_rows for i in chosen], union_into)
        scan = Scan(union, *plan_extents(union, row_bytes, model)[:2])
        scan_s = model.read_time(scan.lengths)
        if scan_s >= sum(saving[i] for i in chosen):
            chosen, scan = [], Scan.empty()
    for i, (p, pp) in enumerate(zip(plans, page_plans)):
        p.read = pp
        if i in chosen:
            nbytes = block_bytes(p.num_read, row_bytes)
            off, ln = block_requests(nbytes, model)
            share = scan_s * nbytes / used
            p.read = ReadPlan(Strategy.BLOCK, off, ln, pp.pages, read_s[i] + (write_s[i] + share) / uses, block_file_name(p))
    return scan


def sorted_union(runs: list[np.ndarray], into: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
    """The sorted distinct rows of `runs` (each sorted, rows >= 0), through a bitset of one
    bit per row up to the largest: a window's read rows (16M at papers' block budget) would
    take twice their bytes again in np.unique's concatenation and sorted copy. Written into
    `into(count)` (an int64 array of count rows: a packer's mapped file) where given."""
    runs = [r for r in runs if len(r)]
    if not runs:
        return np.empty(0, np.int64)
    bits = np.zeros(max(int(r[-1]) for r in runs) // 8 + 1, np.uint8)
    count = sum(bitset.set_rows(bits, r) for r in runs)
    return bitset.rows_set(bits, count, None if into is None else into(count))


def block_file_name(plan) -> str:
    return f"block_e{plan.epoch}_m{plan.index}.bin"


def read_stats(plan, row_bytes: int) -> dict:
    """Per mega-batch read statistics (the loader's reads; a block's repack scan is shared
    by its window and counted in predicted_s only)."""
    useful = plan.num_read * row_bytes
    r = plan.read
    return {
        "strategy": r.strategy.value,
        "requests": len(r.offsets),
        "pages": r.pages,
        "bytes_read": r.nbytes,
        "useful_bytes": useful,
        "read_amplification": r.nbytes / useful if useful else 0.0,
        "predicted_s": r.predicted_s,
    }


def windows(plans: Iterable, row_bytes: int, model: CostModel, disk_budget: int,
            uses: int = 1) -> Iterator[tuple[list, Scan]]:
    """Group consecutive plans into repack windows and plan their reads (read `uses` times:
    see choose_window).

    A window's rows to read fit in half the disk budget, so one window can be trained
    from while the next is repacked. Yields (plans, repack scan)."""
    window, size = [], 0
    for p in plans:
        nbytes = block_bytes(p.num_read, row_bytes)
        if window and size + nbytes > disk_budget // 2:
            yield window, choose_window(window, row_bytes, model, disk_budget // 2, uses)
            window, size = [], 0
        window.append(p)
        size += nbytes
    if window:
        yield window, choose_window(window, row_bytes, model, disk_budget // 2, uses)
