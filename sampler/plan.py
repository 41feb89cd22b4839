"""Mega-batch plans: which feature rows each group of M mini-batches needs, and where.

The planner takes an epoch's mini-batches of seeds as given (sampler.seed_order cuts them,
the same for every loader) and groups them into mega-batches of M mini-batches. For a mega-batch the plan holds the sampled blocks, the
union of their input rows split into hot-cache rows, rows carried over from the previous
mega-batch's buffer and rows to read, and per mini-batch the index of each input row in
the concatenation [hot cache | mega-batch buffer], so the gather is one index_select.

Buffer slot order is [rows to read, ascending | carried rows, ascending]: reads land at the
front of an aligned buffer (a compact block can be read straight into it) and carried rows
are copied behind them from the previous buffer.
"""
from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import numba as nb
import numpy as np

from gnnssd.storage_format import ONE_RELATION, writable_file

from . import bitset
from .blocks import MFGs
from .readplan import ReadPlan
from .sampling import NeighborSampler


@dataclass(frozen=True)
class PlanConfig:
    fanouts: tuple[Any, ...]  # per layer one fanout or one per relation: NeighborSampler's
    mega_batch: int  # M: mini-batches per mega-batch
    seed: int = 0
    method: str = "uniform"  # NeighborSampler's: uniform or labor


@dataclass(frozen=True)
class HotRows:
    """Which store rows the hot cache holds, as the planner consults it: sorted `rows`
    (row rows[k] is in cache slot k) and the row-sized membership `bits`, a bit a row
    (a bool a row took 0.1 GiB at 10^8 rows). The hot cache (gnnssd.pipeline.hot_cache)
    owns one and hands it to the planner."""

    rows: np.ndarray  # int64, sorted, unique
    bits: np.ndarray  # uint8, bit r % 8 of byte r // 8 set == (r in rows)
    num_rows: int

    @classmethod
    def of(cls, rows: np.ndarray, num_rows: int) -> "HotRows":
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        if len(rows) and (rows[0] < 0 or rows[-1] >= num_rows):
            raise ValueError(f"hot rows must lie in 0..{num_rows - 1}, got {rows[0]}..{rows[-1]}")
        bits = np.zeros((num_rows + 7) // 8, np.uint8)
        if len(rows):  # none: no numba kernel (a loader's budget split asks for 0 hot rows without one)
            bitset.set_rows(bits, rows)
        return cls(rows, bits, num_rows)

    def contains(self, rows: np.ndarray) -> np.ndarray:
        """Whether each of `rows` is hot (bool)."""
        rows = np.asarray(rows, np.int64)
        return ((self.bits[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1).astype(np.bool_)

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """Cache slot of each of `rows` (all hot)."""
        return np.searchsorted(self.rows, rows)


@dataclass
class MegaBatchPlan:
    epoch: int
    index: int  # mega-batch index within the epoch
    minibatches: list[MFGs]
    gather: list[np.ndarray]  # per mini-batch: int64 index into [hot cache | buffer]; a piece: see positions
    rows: np.ndarray  # int64 store row of each buffer slot
    num_read: int  # rows[:num_read] come from disk, rows[num_read:] from the previous buffer
    carry_src: np.ndarray  # int64 slot in the previous buffer of rows[num_read:]
    num_hot: int  # rows in the hot cache (offset of the buffer in the concatenation)
    stats: dict = field(default_factory=dict)
    read: ReadPlan | None = None  # filled by the read planner
    spill_path: str = ""  # set on a stub whose mini-batches wait on disk (see spill)
    #: A mini-batch too large for a buffer is planned as `pieces` plans, this one number
    #: `piece` (see RowUnion.pieces); 0 pieces: a whole plan of one or more mini-batches.
    piece: int = 0
    pieces: int = 0
    #: A piece plan's gather[0] holds the slots of only the input rows this piece supplies;
    #: positions[k] (int64) is the row of the mini-batch's x that gather[0][k] fills. Empty
    #: for a whole plan, whose gather[i] covers mini-batch i's every input row in order.
    positions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @property
    def read_rows(self) -> np.ndarray:
        return self.rows[: self.num_read]

    @property
    def ends_minibatch(self) -> bool:
        """A whole plan, or the last piece of a mini-batch (the one that yields it)."""
        return not self.pieces or self.piece == self.pieces - 1

    def spill(self, path: str | Path) -> "MegaBatchPlan":
        """Write the plan to `path` and return a stub without its mini-batches and gather
        indices (most of its memory) but with everything reads and repacking use.
        While a repack window fills, its plans wait as stubs."""
        _spill_plan(self, path)
        return replace(self, minibatches=[], gather=[], positions=np.empty(0, np.int64), spill_path=str(path))

    def restore(self, keep_file: bool = False) -> "MegaBatchPlan":
        """The whole plan of a stub (its read plan as set since the spill); deletes the file
        unless `keep_file` (a plan kept to be replayed: gnnssd.pipeline.kept)."""
        full = _unspill_plan(self.spill_path)
        full.read = self.read
        if not keep_file:
            Path(self.spill_path).unlink()
        return full

    def equals(self, other: "MegaBatchPlan") -> bool:
        same = (
            (self.epoch, self.index, self.num_read, self.num_hot, self.piece, self.pieces)
            == (other.epoch, other.index, other.num_read, other.num_hot, other.piece, other.pieces)
            and len(self.minibatches) == len(other.minibatches)
            and all(a.equals(b) for a, b in zip(self.minibatches, other.minibatches))
            and all(np.array_equal(a, b) for a, b in zip(self.gather, other.gather))
            and np.array_equal(self.rows, other.rows)
            and np.array_equal(self.carry_src, other.carry_src)
            and np.array_equal(self.positions, other.positions)
            and self.stats == other.stats
        )
        if (self.read is None) != (other.read is None):
            return False
        return same and (self.read is None or self.read.equals(other.read))


# The union's rows -> their index in first-seen order, as a hash table sized by the union
# (not a slot a row of the graph, which took 0.42 GiB at 10^8 rows for the process's life):
# open addressing with linear probing, each entry packed as row << 32 | index (-1 empty), so
# a probe touches one int64; the table is a power of two at most MAX_LOAD full.
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)
_LOW = np.int64(0xFFFFFFFF)
MAX_LOAD = 0.5


@nb.njit(cache=True, nogil=True, inline="always")
def _home(row, shift):
    """The table position a row's probe starts at: the row itself in a table with a place
    for every row (shift < 0), else Fibonacci hashing (the top bits of row * 2^64/phi)."""
    if shift < 0:
        return row
    return np.int64((np.uint64(row) * _FIBONACCI) >> np.uint64(shift))


@nb.njit(cache=True, nogil=True, inline="always")
def _find(table, shift, row):
    """The table position holding `row`, or the empty one where it would go."""
    mask = table.shape[0] - 1
    h = _home(row, shift)
    while table[h] >= 0 and (table[h] >> 32) != row:
        h = (h + 1) & mask
    return h


@nb.njit(cache=True, nogil=True)
def _unset(rows, table, shift):
    """Take out `rows`, the last rows put in the table, in that order: last first, which
    leaves the table exactly as before they came (no probe run is cut)."""
    for k in range(rows.shape[0] - 1, -1, -1):
        table[_find(table, shift, rows[k])] = -1


@nb.njit(cache=True, nogil=True)
def _add_rows(nodes, table, shift, hot_bits, uniq, index, state, limit):
    """Add the rows of `nodes` missing from the union: uniq[state[0]:] in first-seen order,
    the table maps each to its index there, and index[state[2]:] gets each of `nodes`' index
    in uniq. state = [unique rows, cold unique rows, input rows]. When the cold rows would
    exceed `limit`, the union is left as it was and False is returned. The table must have
    room for every row of `nodes`."""
    count, cold, at = state[0], state[1], state[2]
    for x in nodes:
        h = _find(table, shift, x)
        if table[h] < 0:
            table[h] = (x << 32) | count
            uniq[count] = x
            count += 1
            cold += not bitset.has(hot_bits, x)
        index[at] = table[h] & _LOW
        at += 1
    if cold > limit:
        _unset(uniq[state[0] : count], table, shift)
        return False
    state[0], state[1], state[2] = count, cold, at
    return True


@nb.njit(cache=True, nogil=True)
def _insert_all(rows, table, shift):
    """Put distinct `rows` in an empty table, rows[k] at index k."""
    for k in range(rows.shape[0]):
        table[_find(table, shift, rows[k])] = (rows[k] << 32) | k


@nb.njit(cache=True, nogil=True)
def _carried(cold, prev, lo, hi, carried, carry_slot):
    """Mark the sorted `cold` rows found in the sorted run prev[lo:hi] (slot = position)."""
    j = lo
    for i in range(cold.shape[0]):
        while j < hi and prev[j] < cold[i]:
            j += 1
        if j < hi and prev[j] == cold[i]:
            carried[i] = True
            carry_slot[i] = j


@nb.njit(cache=True, nogil=True)
def _split_sorted(rows, order, hot_bits, hot_rows, value, cold_at):
    """For distinct `rows` and `order` the positions of rows in ascending row order: value[k]
    = the cache slot of a hot rows[k] (the hot rows before it); the positions of the cold
    ones go to cold_at in row order. Returns how many are cold."""
    count = 0
    j = 0
    for k in order:
        r = rows[k]
        if bitset.has(hot_bits, r):
            while hot_rows[j] < r:  # the hot rows met come in ascending order
                j += 1
            value[k] = j
        else:
            cold_at[count] = k
            count += 1
    return count


@nb.njit(cache=True, nogil=True)
def _scan_rows(table, hot_bits, value, cold_at):
    """Walk a table with a place a row (see RowUnion._reserve) in row order: a hot row of
    the union gets value[its index] = its cache slot (the hot rows before it); the indices
    of the union's cold rows go to cold_at in row order. Returns how many are cold."""
    rank = 0
    count = 0
    for r in range(table.shape[0]):
        entry = table[r]
        if bitset.has(hot_bits, r):
            if entry >= 0:
                value[entry & _LOW] = rank
            rank += 1
        elif entry >= 0:
            cold_at[count] = entry & _LOW
            count += 1
    return count


@nb.njit(parallel=True, cache=True, nogil=True)
def _gather_index(index, value, out):
    for i in nb.prange(index.shape[0]):
        out[i] = value[index[i]]


def _row_order(rows: np.ndarray) -> np.ndarray:
    """Positions of distinct non-negative `rows` (below 2^31) in ascending row order: one
    sort of row << 32 | position (NumPy's sort of int64 is several times its argsort)."""
    packed = (rows << 32) | np.arange(len(rows), dtype=np.int64)
    packed.sort()
    packed &= _LOW
    return packed


def plan_bytes(mfgs: MFGs) -> int:
    """Bytes a mini-batch adds to its mega-batch plan: its blocks and its gather index
    (int64 per input row); what plans in flight hold grows with these."""
    return mfgs.nbytes + 8 * len(mfgs.input_rows)


def _room(array: np.ndarray, used: int, more: int) -> np.ndarray:
    """`array` (its first `used` entries kept), grown if it has no room for `more`."""
    if len(array) >= used + more:
        return array
    grown = np.empty(max(2 * len(array), used + more), array.dtype)
    grown[:used] = array[:used]
    return grown


class RowUnion:
    """The union of the input rows of a growing group of mini-batches, in time linear in
    the inputs: a hash table sized by the union (row -> index in first-seen order) instead
    of sorting every input row; between groups it keeps only the table."""

    #: rows are packed in a table entry as row << 32 | index
    MAX_ROWS = 1 << 31

    def __init__(self, num_rows: int, hot: HotRows):
        if hot.num_rows != num_rows:
            raise ValueError(f"the hot-row bitset covers {hot.num_rows} rows, the graph has {num_rows}")
        if num_rows > self.MAX_ROWS:
            raise ValueError(f"the planner takes at most {self.MAX_ROWS:,} rows, the graph has {num_rows:,}")
        self.hot = hot
        self.num_rows = num_rows
        self.table = np.full(16, -1, np.int64)
        self.shift = 64 - 4  # 64 - log2(len(table))
        self.uniq = np.empty(0, np.int64)
        self.index = np.empty(0, np.int32)  # each input row's index in uniq, members in order
        self.state = np.zeros(3, np.int64)  # unique rows, cold unique rows, input rows
        self.members: list[MFGs] = []
        self.bytes = 0  # plan_bytes of the members

    def _reserve(self, rows: int) -> None:
        """Room in the table for `rows` rows in all (rehashed into a larger table if not).
        A table that would hold as many places as the graph has rows gets one a row instead,
        indexed by the row (no probing: as fast as a slot map, and never larger than the
        hash table it replaces)."""
        if self.shift < 0 or rows <= MAX_LOAD * len(self.table):
            return
        bits = max(4, int(np.ceil(np.log2(rows / MAX_LOAD))))
        if 1 << bits >= self.num_rows:
            self.table, self.shift = np.full(self.num_rows, -1, np.int64), -1
        else:
            self.table, self.shift = np.full(1 << bits, -1, np.int64), 64 - bits
        _insert_all(self.uniq[: self.state[0]], self.table, self.shift)

    def add(self, mfgs: MFGs, limit: int, max_bytes: int | None = None) -> bool:
        """Add a mini-batch unless the cold rows would exceed `limit`, or its members'
        plan_bytes `max_bytes` (a first member is added whatever its bytes)."""
        size = plan_bytes(mfgs)
        if max_bytes is not None and self.members and self.bytes + size > max_bytes:
            return False
        nodes = np.asarray(mfgs.input_rows, np.int64)
        self.uniq = _room(self.uniq, int(self.state[0]), len(nodes))
        self.index = _room(self.index, int(self.state[2]), len(nodes))
        self._reserve(int(self.state[0]) + len(nodes))
        if not _add_rows(nodes, self.table, self.shift, self.hot.bits, self.uniq, self.index, self.state, limit):
            return False
        self.members.append(mfgs)
        self.bytes += size
        return True

    def cold_rows(self) -> int:
        return int(self.state[1])

    def clear(self) -> None:
        if self.state[0] * 16 >= len(self.table):  # a sequential fill beats the probes
            self.table.fill(-1)
        else:
            _unset(self.uniq[: self.state[0]], self.table, self.shift)
        # the table stays (sized by the largest union); these go with the group (the plan's
        # gather index replaces the input rows' indices)
        self.uniq, self.index = np.empty(0, np.int64), np.empty(0, np.int32)
        self.state[:] = 0
        self.members = []
        self.bytes = 0

    def _split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For distinct `rows`, which the table maps to their positions (rows[k] -> k): the
        cache slot of each hot one (value[k]; the cold ones' entries are unset) and the
        positions of the cold ones in ascending row order. A table with a place a row is
        walked in row order (linear in the rows, no allocation); rows in a hash table are
        sorted."""
        value = np.empty(len(rows), np.int64)
        cold_at = np.empty(len(rows), np.int64)
        if self.shift < 0:
            count = _scan_rows(self.table, self.hot.bits, value, cold_at)
        else:
            count = _split_sorted(rows, _row_order(rows), self.hot.bits, self.hot.rows, value, cold_at)
        return value, cold_at[:count]

    def take(self, prev_rows: np.ndarray | None, prev_num_read: int, epoch: int, index: int) -> "MegaBatchPlan":
        """The plan of the current group; the union is emptied for the next one.

        prev_rows: the previous mega-batch's buffer rows in slot order, two sorted runs
        split at prev_num_read (or None)."""
        mfgs = self.members
        uniq = self.uniq[: self.state[0]]
        # each unique row's index in [hot cache | buffer], in uniq order (hot rows here,
        # cold rows below once the carried ones are known)
        value, cold_at = self._split(uniq)
        cold = uniq[cold_at]
        carried = np.zeros(len(cold), np.bool_)
        carry_slot = np.zeros(len(cold), np.int64)
        if prev_rows is not None:
            for lo, hi in ((0, prev_num_read), (prev_num_read, len(prev_rows))):
                _carried(cold, prev_rows, lo, hi, carried, carry_slot)
        read_rows, carry_rows = cold[~carried], cold[carried]
        num_hot = len(self.hot.rows)
        value[cold_at[~carried]] = num_hot + np.arange(len(read_rows))
        value[cold_at[carried]] = num_hot + len(read_rows) + np.arange(len(carry_rows))
        gather_all = np.empty(int(self.state[2]), np.int64)
        _gather_index(self.index[: len(gather_all)], value, gather_all)
        self.clear()
        is_hot_input = gather_all < num_hot
        hot_hits = int(is_hot_input.sum())
        stats = {
            "minibatches": len(mfgs),
            "input_rows": len(gather_all),
            "unique_rows": int(len(uniq)),
            "sharing": float(len(gather_all) / max(len(uniq), 1)),
            "hot_hits": hot_hits,
            "cold_unique_rows": int(len(cold)),
            "carried_rows": int(len(carry_rows)),
            "read_rows": int(len(read_rows)),
            # rows a per-mini-batch loader with the same hot cache would fetch (no mega-batch dedup)
            "minibatch_cold_rows": len(gather_all) - hot_hits,
        }
        return MegaBatchPlan(
            epoch=epoch,
            index=index,
            minibatches=mfgs,
            gather=np.split(gather_all, np.cumsum([len(m.input_rows) for m in mfgs])[:-1]),
            rows=np.concatenate([read_rows, carry_rows]),
            num_read=int(len(read_rows)),
            carry_src=carry_slot[carried],
            num_hot=num_hot,
            stats=stats,
        )

    def pieces(self, mfgs: MFGs, max_rows: int, epoch: int, index: int) -> Iterator[MegaBatchPlan]:
        """One mini-batch too large for a buffer as plans of at most `max_rows` cold rows
        each (its sorted cold rows cut in order), numbered from `index`, made one at a time;
        the union must be empty (its table serves as scratch). Piece k lists only the
        input rows it supplies (the hot rows in piece 0, cold rows in the piece that reads
        them): their positions in the mini-batch's x (`positions`) and their slots in [hot
        cache | buffer] (gather[0]), so k pieces cost one mini-batch's index in all, not k;
        the caller fills x (stats["input_rows"] of piece 0 rows) piece by piece (`piece` k
        of `pieces`). Pieces carry nothing over: each buffer holds only its own rows."""
        if self.members:
            raise ValueError("pieces are planned from an empty union")
        nodes = np.asarray(mfgs.input_rows, np.int64)  # distinct within a mini-batch
        self._reserve(len(nodes))
        _insert_all(nodes, self.table, self.shift)
        try:
            value, cold_pos = self._split(nodes)
        finally:
            _unset(nodes, self.table, self.shift)
        hot_pos = np.flatnonzero(self.hot.contains(nodes))
        cold = nodes[cold_pos]
        num_hot = len(self.hot.rows)
        count = -(-len(cold) // max_rows)
        for k in range(count):
            lo, hi = k * max_rows, min((k + 1) * max_rows, len(cold))
            slots = num_hot + np.arange(hi - lo)
            positions = cold_pos[lo:hi]
            if k == 0:
                slots, positions = np.concatenate([value[hot_pos], slots]), np.concatenate([hot_pos, positions])
            first = int(k == 0)  # the mini-batch's own counts go with its first piece
            hot_hits = first * len(hot_pos)
            stats = {"minibatches": first, "input_rows": first * len(nodes), "unique_rows": hi - lo + hot_hits,
                     "sharing": float(first * len(nodes) / (hi - lo + hot_hits)), "hot_hits": hot_hits,
                     "cold_unique_rows": hi - lo, "carried_rows": 0, "read_rows": hi - lo,
                     "minibatch_cold_rows": first * len(cold)}
            yield MegaBatchPlan(epoch=epoch, index=index + k, minibatches=[mfgs], gather=[slots],
                                rows=cold[lo:hi], num_read=hi - lo, carry_src=np.empty(0, np.int64),
                                num_hot=num_hot, stats=stats, piece=k, pieces=count, positions=positions)


class Planner:
    """Samples and plans the mega-batches of one or more epochs (pure function of the seed).

    `hot_rows`: the hot cache's HotRows (or the rows themselves); their rows are gathered
    from the cache and never read.

    With `max_rows`, a group of M mini-batches whose buffer rows would exceed it is cut
    greedily: each mega-batch takes mini-batches in order while its rows fit `max_rows`.
    A single mini-batch whose cold rows exceed `max_rows` is streamed: planned as a run of
    piece plans (see `pieces`), so a buffer need not hold a whole mini-batch.

    With `max_bytes`, plans are bounded by bytes as well: a mega-batch is cut before a
    mini-batch that would take its blocks and gather indices (plan_bytes) past
    `max_bytes` (a single mini-batch may pass it), and mini-batches are sampled at most as
    many at once as fit `max_bytes` by the size of the last one sampled (a mini-batch's
    neighbour draws depend on its position, not on how many are sampled with it), so
    the planner holds about two plans' bytes and each plan at most one.
    """

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        config: PlanConfig,
        hot_rows: HotRows | np.ndarray | None = None,
        max_rows: int | None = None,
        etypes: np.ndarray = ONE_RELATION,
        num_relations: int = 1,
        feature_rows: int = -1,
        max_bytes: int | None = None,
    ):
        self.config = config
        num_rows = len(indptr) - 1
        hot = hot_rows if isinstance(hot_rows, HotRows) else HotRows.of(
            np.empty(0, np.int64) if hot_rows is None else hot_rows, num_rows)
        self.hot = hot
        self.union = RowUnion(num_rows, hot)
        self.sampler = NeighborSampler(indptr, indices, config.fanouts, etypes, num_relations, feature_rows,
                                       config.method)
        self.max_rows = np.iinfo(np.int64).max if max_rows is None else max_rows
        self.max_bytes = max_bytes
        self._minibatch_bytes = 0  # plan_bytes of the last mini-batch sampled
        # the last plan's buffer rows and rows read, which the next plan carries rows from
        # (not the plan: its blocks would stay alive in the planner)
        self._prev: tuple[np.ndarray, int] | None = None

    def plan_batches(self, batches: list[np.ndarray], epoch: int,
                     exclude: list[np.ndarray] | None = None, first: int = 0) -> Iterator[MegaBatchPlan]:
        """Mega-batch plans of given mini-batches of seeds (groups of M, cut to fit
        `max_rows`); carry-over continues from the previous call's last plan. `first` is
        the epoch position of batches[0] (its neighbour draws are those of that position). With
        `exclude`, batch b is sampled without the edges exclude[b] and their reverses (see
        NeighborSampler.sample_many): edge mini-batches, whose seeds are their edges' endpoints."""
        cfg = self.config
        index = 0
        for start in range(0, len(batches), cfg.mega_batch):
            group = batches[start : start + cfg.mega_batch]
            excluded = None if exclude is None else exclude[start : start + cfg.mega_batch]
            for mfgs in self._sampled(group, (epoch << 32) + first + start, excluded):
                if self.union.add(mfgs, self.max_rows, self.max_bytes):
                    continue
                if self.union.members:  # full: a new mega-batch starts with this mini-batch
                    yield self._take(epoch, index)
                    index += 1
                    if self.union.add(mfgs, self.max_rows, self.max_bytes):
                        continue
                for piece in self.union.pieces(mfgs, self.max_rows, epoch, index):
                    self._prev = piece.rows, piece.num_read  # the next plan carries from the last piece's buffer
                    yield piece
                    del piece
                    index += 1
            if self.union.members:
                yield self._take(epoch, index)
                index += 1

    def _sampled(self, group: list[np.ndarray], first_id: int,
                 exclude: list[np.ndarray] | None) -> Iterator[MFGs]:
        """The blocks of a group of seed batches (batch IDs from `first_id`), sampled all
        at once, or with `max_bytes` as many at a time as fit it (one at first)."""
        done = 0
        while done < len(group):
            count = len(group) - done
            if self.max_bytes is not None:
                count = min(count, max(1, self.max_bytes // self._minibatch_bytes) if self._minibatch_bytes else 1)
            chunk = group[done : done + count]
            ptr = np.concatenate([[0], np.cumsum([len(b) for b in chunk])])
            sampled = self.sampler.sample_many(np.concatenate(chunk), ptr, self.config.seed, first_id + done,
                                               None if exclude is None else exclude[done : done + count])
            done += count
            while sampled:
                mfgs = sampled.pop(0)  # the planner keeps no reference to a mini-batch it passed on
                self._minibatch_bytes = plan_bytes(mfgs)
                yield mfgs
                del mfgs

    def _take(self, epoch: int, index: int) -> MegaBatchPlan:
        plan = self.union.take(*(self._prev or (None, 0)), epoch, index)
        self._prev = plan.rows, plan.num_read
        return plan


#: Spill files align every array to this many bytes (numba's kernels take aligned arrays).
SPILL_ALIGN = 8


def _spill_plan(plan: MegaBatchPlan, path: str | Path) -> None:
    """The plan's arrays in a private scratch file, written and read back at memory speed:
    an 8-byte header length, a JSON header (each array's name, dtype and shape), then the
    arrays' bytes, each at a multiple of SPILL_ALIGN. One header for the whole plan, not
    one .npy header to parse per array (a zip's CRC-32 costs more than the write)."""
    arrays = {name: np.ascontiguousarray(a) for name, a in _plan_arrays(plan).items()}
    header = json.dumps([[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]).encode()
    with writable_file(Path(path), Path(path).parent) as f:  # never through a planted link
        f.write(len(header).to_bytes(8, "little") + header + bytes(-len(header) % SPILL_ALIGN))
        for a in arrays.values():
            f.write(memoryview(a.reshape(-1).view(np.uint8)))
            f.write(bytes(-a.nbytes % SPILL_ALIGN))


def _unspill_plan(path: str | Path) -> MegaBatchPlan:
    """The plan `_spill_plan` wrote to `path`: the arrays are views of a private (copy on
    write) mapping of the file, so restoring copies nothing: a read into fresh memory cost
    the read thread a copy and a zeroed page per 4 KiB (~10 ms a mini-batch of ~10 pieces on
    `medium`). The file may be deleted once restored; the mapping lives as long as the arrays."""
    with open(path, "rb") as f:
        length = os.fstat(f.fileno()).st_size
        data = (np.frombuffer(mmap.mmap(f.fileno(), length, access=mmap.ACCESS_COPY), np.uint8) if length
                else np.empty(0, np.uint8))  # the checks below name a file too short for its header
    size = int.from_bytes(data[:8].tobytes(), "little")
    at = 8 + size + -size % SPILL_ALIGN
    arrays = {}
    for name, dtype, shape in json.loads(data[8 : 8 + size].tobytes().decode()):
        count = math.prod(shape)  # plain ints (np.prod's array round trip, ~20 arrays a plan)
        nbytes = count * np.dtype(dtype).itemsize
        if at + nbytes > len(data):
            raise ValueError(f"{path}: spilled plan truncated ({len(data)} bytes; array {name!r} ends at "
                             f"{at + nbytes})")
        arrays[name] = np.frombuffer(data, dtype, count, at).reshape(shape)
        at += nbytes + -nbytes % SPILL_ALIGN
    return _plan_from_arrays(arrays)


def _plan_arrays(plan: MegaBatchPlan) -> dict[str, np.ndarray]:
    """The plan's arrays; a plan may hold no mini-batches (a piece spilled without the
    blocks its last piece carries: see gnnssd.loading.backends.ssd)."""
    mb = plan.minibatches
    none = np.empty(0, np.int64)
    arrays = {
        "nodes": np.concatenate([m.nodes for m in mb] or [none]),
        "node_len": np.array([len(m.nodes) for m in mb], np.int64),
        "num_src": np.stack([m.num_src for m in mb]) if mb else np.zeros((0, 1), np.int64),
        "num_dst": np.stack([m.num_dst for m in mb]) if mb else np.zeros((0, 1), np.int64),
        "edge_ptr": np.stack([m.edge_ptr for m in mb]) if mb else np.zeros((0, 1), np.int64),
        "edge_src": np.concatenate([m.edge_src for m in mb] or [none.astype(np.int32)]),
        "edge_dst": np.concatenate([m.edge_dst for m in mb] or [none.astype(np.int32)]),
        "feature_rows": np.array([m.feature_rows for m in mb], np.int64),
        "gather": np.concatenate(plan.gather),
        "rows": plan.rows,
        "carry_src": plan.carry_src,
        "positions": plan.positions,
        "meta": np.frombuffer(
            json.dumps(
                {"epoch": plan.epoch, "index": plan.index, "num_read": plan.num_read, "num_hot": plan.num_hot,
                 "stats": plan.stats, "piece": plan.piece, "pieces": plan.pieces}
            ).encode(),
            np.uint8,
        ),
    }
    arrays["edge_type"] = np.concatenate([m.edge_type for m in mb] or [ONE_RELATION])
    if plan.read is not None:
        arrays.update({f"read_{k}": v for k, v in plan.read.to_arrays().items()})
    return arrays


def _plan_from_arrays(a: dict[str, np.ndarray]) -> MegaBatchPlan:
    meta = json.loads(a["meta"].tobytes().decode())
    node_off = np.concatenate([[0], np.cumsum(a["node_len"])])
    edge_off = np.concatenate([[0], np.cumsum(a["edge_ptr"][:, -1])])
    mfgs = [
        MFGs(
            nodes=a["nodes"][node_off[i] : node_off[i + 1]],
            num_src=a["num_src"][i],
            num_dst=a["num_dst"][i],
            edge_ptr=a["edge_ptr"][i],
            edge_src=a["edge_src"][edge_off[i] : edge_off[i + 1]],
            edge_dst=a["edge_dst"][edge_off[i] : edge_off[i + 1]],
            edge_type=a["edge_type"][edge_off[i] : edge_off[i + 1]],
            feature_rows=int(a["feature_rows"][i]),
        )
        for i in range(len(a["node_len"]))
    ]
    # a piece's one gather index covers only its own rows (see MegaBatchPlan.positions)
    gather = [a["gather"]] if meta["pieces"] else np.split(a["gather"], np.cumsum([len(m.input_rows) for m in mfgs])[:-1])
    read = {k[5:]: v for k, v in a.items() if k.startswith("read_")}
    return MegaBatchPlan(
        epoch=meta["epoch"],
        index=meta["index"],
        minibatches=mfgs,
        gather=list(gather),
        rows=a["rows"],
        carry_src=a["carry_src"],
        num_read=meta["num_read"],
        num_hot=meta["num_hot"],
        stats=meta["stats"],
        read=ReadPlan.from_arrays(read) if read else None,
        piece=meta["piece"],
        pieces=meta["pieces"],
        positions=a["positions"] if "positions" in a else np.empty(0, np.int64),
    )
