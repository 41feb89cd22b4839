"""The loaders gnnssd is measured against (scripts/bench_train.py), beside `memory`.

- `MmapLoader`: features indexed out of a NumPy memmap of features.bin:
  what most users do today. Every missing page is a synchronous fault.
- `PerRowLoader`: each input row not in an LRU cache (`LRUCache`, a row
  source around its fallback as the hot cache is) read as its own page with O_DIRECT
  through the io_engine (`PageReads`): the Ginex / GraphBolt DiskBasedFeature way.

Both sample exactly as `MemoryLoader` does (they share its `SampledLoader` base: gnnssd's
counter-based sampler, and its loader protocol), so for the same seed they yield the same
blocks and the same `x`: only the way to the features differs. `NodeLoader(...,
features="mmap" | "per-row")` runs them.
"""
from __future__ import annotations

from pathlib import Path

import numba as nb
import numpy as np
import torch

from gnnssd.core import SamplerConfig, SSDConfig, StageTimer
from gnnssd.io_engine import Engine
from gnnssd.pipeline import RowSource
from gnnssd.sampler import per_row_requests
from gnnssd.storage_format import Store

from ..types import IOCounters
from .memory import SampledLoader


class MmapLoader(SampledLoader):
    """Features indexed out of `store.features_memmap()`. The page faults happen inside
    the indexing, so reading and gathering are one stage: "read"; `io_stats` cannot see
    them (they are the kernel's reads)."""

    NAME = "mmap"

    #: Reads through the page cache, which the kernel sizes (no budget of its own); the
    #: baselines serve node mini-batches only (what the benchmarks compare).
    OUT_OF_CORE = True
    EDGE_BATCHES = False

    def __init__(self, store: Store, device: torch.device, timer: StageTimer, seed: int = 0):
        super().__init__(store, device, timer, seed)
        self.features = store.features_memmap()

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        with self.timer.stage("read"):
            return self._as_float32(np.asarray(self.features[rows]), rows)


class LRUSlots:
    """Which row each of `capacity` slots holds, least recently used evicted: an exact LRU
    (a doubly linked list in arrays, updated by numba). `access(rows)` applies the rows in
    order, one access each, as an OrderedDict with move-to-end on a hit and insert (evicting
    the least recently used) on a miss would.

    The index `slot_of` holds one int32 per row (4 bytes x num_rows, outside the
    capacity, like the topology)."""

    def __init__(self, capacity: int, num_rows: int):
        self.capacity = capacity
        self.slot_of = np.full(num_rows, -1, dtype=np.int32)
        self.key = np.full(capacity, -1, dtype=np.int64)
        self.prev = np.full(capacity, -1, dtype=np.int64)
        self.next = np.full(capacity, -1, dtype=np.int64)
        self.state = np.array([-1, -1, 0], dtype=np.int64)  # head (most recent), tail, size
        self.filled_at = np.full(capacity, -1, dtype=np.int64)  # within an access: the position that filled a slot
        self.hits = 0
        self.misses = 0

    def access(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slot, hit, again) per row; a missed row's slot is where it now lives (-1 with
        capacity 0); `again` is, for a hit on a row a miss of this same access inserted (a
        row asked twice), that miss's position, else -1."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        slots = np.empty(len(rows), dtype=np.int64)
        hit = np.empty(len(rows), dtype=np.bool_)
        again = np.empty(len(rows), dtype=np.int64)
        n_hits = _lru_access(rows, self.slot_of, self.key, self.prev, self.next, self.state,
                             self.filled_at, slots, hit, again)
        self.hits += n_hits
        self.misses += len(rows) - n_hits
        return slots, hit, again

    def keys(self) -> list[int]:
        """Cached rows, least recently used first."""
        out, slot = [], int(self.state[1])
        while slot >= 0:
            out.append(int(self.key[slot]))
            slot = int(self.prev[slot])
        return out


class LRUCache:
    """A row source (pipeline.RowSource) holding the `capacity` rows of `fallback` read
    most recently, asking `fallback` for the others; its bookkeeping and copies are timed
    as the stage "gather" of `timer`."""

    def __init__(self, fallback: RowSource, capacity: int, num_rows: int, timer: StageTimer | None = None):
        self.fallback, self.timer = fallback, timer or StageTimer()
        self.feat_dim, self.dtype, self.row_bytes = fallback.feat_dim, fallback.dtype, fallback.row_bytes
        self.slots = LRUSlots(capacity, num_rows)
        self.data = np.empty((capacity, self.feat_dim), self.dtype)

    def read(self, ids: np.ndarray) -> np.ndarray:
        with self.timer.stage("gather"):
            slots, hit, again = self.slots.access(ids)
            out = np.empty((len(ids), self.feat_dim), self.dtype)
            out[hit] = self.data[slots[hit]]  # before misses may overwrite those slots
            missed = np.flatnonzero(~hit)
        fresh = self.fallback.read(ids[missed])
        with self.timer.stage("gather"):
            out[missed] = fresh
            self._keep(slots[missed], fresh)
            repeated = np.flatnonzero(again >= 0)  # copied from their slot before the read filled it
            out[repeated] = out[again[repeated]]
        return out

    def _keep(self, slots: np.ndarray, fresh: np.ndarray) -> None:
        """Store the rows just read in their cache slots. With more rows in a batch than
        the cache holds, a slot can be reused within the batch: its last row wins, as in
        the LRU."""
        kept = np.flatnonzero(slots >= 0)
        if len(slots) > self.slots.capacity:
            _, last_first = np.unique(slots[kept][::-1], return_index=True)
            kept = kept[len(kept) - 1 - last_first]
        self.data[slots[kept]] = fresh[kept]


class PageReads:
    """A row source over a store's features file reading each row as its own page run
    (O_DIRECT, `Engine.read_rows` with one request per row: no merging), as Ginex and
    GraphBolt's DiskBasedFeature do; the reads are counted in `io` and timed as the stage
    "read" of `timer`. `close()` closes the engine."""

    def __init__(self, store: Store, io: IOCounters, timer: StageTimer, engine: Engine | None = None):
        self.feat_dim, self.dtype, self.row_bytes = store.feat_dim, store.feat_dtype, store.row_bytes
        self.io, self.timer = io, timer
        self.engine = engine or Engine()
        self.file = self.engine.open(store.features_path, checksums=store.page_checksums())
        self.staging = self.engine.alloc(2 * self.engine.chunk_bytes)

    def read(self, ids: np.ndarray) -> np.ndarray:
        with self.timer.stage("read"):
            offsets, lengths = per_row_requests(np.sort(ids), self.row_bytes)
            fresh = self.engine.read_rows(self.file, ids, self.row_bytes, offsets, lengths, staging=self.staging)
        self.io.add(bytes_read=int(lengths.sum()), requests=len(lengths), useful_bytes=len(ids) * self.row_bytes)
        return fresh.view(self.dtype)

    def close(self) -> None:
        self.file.close()
        self.engine.close()


@nb.njit(cache=True)
def _lru_access(rows, slot_of, key, prev, nxt, state, filled_at, slots, hit, again):
    head, tail, size = state[0], state[1], state[2]
    capacity = key.shape[0]
    n_hits = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        s = slot_of[r]
        if s >= 0:
            hit[i] = True
            again[i] = filled_at[s]
            n_hits += 1
            if s != head:  # unlink, then push at the head
                p, q = prev[s], nxt[s]
                nxt[p] = q
                if q >= 0:
                    prev[q] = p
                else:
                    tail = p
                prev[s] = -1
                nxt[s] = head
                prev[head] = s
                head = s
        else:
            hit[i] = False
            again[i] = -1
            if capacity == 0:
                s = -1
            else:
                if size < capacity:
                    s = size
                    size += 1
                else:  # evict the tail
                    s = tail
                    slot_of[key[s]] = -1
                    tail = prev[s]
                    if tail >= 0:
                        nxt[tail] = -1
                    else:
                        head = -1
                key[s] = r
                slot_of[r] = s
                filled_at[s] = i
                prev[s] = -1
                nxt[s] = head
                if head >= 0:
                    prev[head] = s
                head = s
                if tail < 0:
                    tail = s
        slots[i] = s
    for i in range(rows.shape[0]):  # the next access starts with no slot filled
        if not hit[i] and slots[i] >= 0:
            filled_at[slots[i]] = -1
    state[0], state[1], state[2] = head, tail, size
    return n_hits


class PerRowLoader(SampledLoader):
    """Rows missing from an LRU cache of `budget_bytes` read one page each (`PageReads`);
    stages "read" (the engine) and "gather" (cache bookkeeping and copies). `close()` (or
    a with-block) closes the engine."""

    NAME = "per-row"

    #: The LRU cache holds ssd.memory_budget; node mini-batches only, as MmapLoader.
    OUT_OF_CORE = True
    MEMORY_BUDGET = True
    EDGE_BATCHES = False

    @classmethod
    def open(cls, store: Store, ssd: SSDConfig, sampling: SamplerConfig, seed: int, device: torch.device,
             timer: StageTimer, scratch_dir: Path | None) -> PerRowLoader:
        """The LRU cache takes the whole `ssd.memory_budget`."""
        return cls(store, device, timer, seed, ssd.memory_budget).sampling_by(sampling.method)

    def __init__(self, store: Store, device: torch.device, timer: StageTimer, seed: int,
                 budget_bytes: int, engine: Engine | None = None):
        super().__init__(store, device, timer, seed)
        self.pages = PageReads(store, self.io, timer, engine)
        self.cache = LRUCache(self.pages, budget_bytes // store.row_bytes, store.num_nodes, timer)

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        raw = self.cache.read(rows)
        with self.timer.stage("gather"):
            return self._as_float32(raw, rows)

    def io_stats(self) -> dict[str, int]:
        slots = self.cache.slots
        return {**self.io.as_dict(), "cache_rows": slots.capacity, "cache_hits": slots.hits,
                "cache_misses": slots.misses}

    def close(self) -> None:
        self.pages.close()
