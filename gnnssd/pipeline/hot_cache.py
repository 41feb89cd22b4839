"""The hot cache: the feature rows sampling reaches most, held in memory for the whole run.

It is the one owner of which rows are hot, and of where each is. It wraps a row source, its
fallback (the SSD reader in training, a layer's file in layer-wise inference), as
GraphBolt's cached features wrap their fallback feature: the planner consults its
membership (`members`, a sampler.HotRows: the sorted rows and their row-sized bitset) so
that hot rows are never read. The hot rows live on two levels: the hottest slice on the
loader's device (`ssd.device_budget`; a CPU tensor on the CPU) and the rest in host memory
(`data`, pinned when a GPU reads it). `places` says, for each row of a mini-batch's x,
which level holds it and where, or that it is a cold row of the mega-batch buffer the
reader filled: the host gather and the device gather both assemble x from its answer.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba as nb
import numpy as np

from gnnssd.pipeline.row_source import RowSource
from gnnssd.sampler import ORDERS, HotRows, hot_order
from gnnssd.storage_format import Store

if TYPE_CHECKING:
    import torch

#: Rows of a level filled through the fallback per read: bounds the host memory a device
#: level or a pinned cache takes beside itself while it is filled (a chunk at a time).
FILL_BYTES = 64 << 20
#: No positions: a whole x, in order (RowPlaces.at).
NO_ROWS = np.empty(0, np.int64)


def pinned_empty(nbytes: int) -> np.ndarray:
    """`nbytes` of page-locked host memory (torch's pinned allocator; needs CUDA), as a
    flat uint8 array that keeps its tensor alive: a GPU copies from it asynchronously and
    reads it in place."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()


#: RowPlaces' levels: the device slice, the host cache, the mega-batch buffer (cold rows).
DEVICE, HOST, COLD = 0, 1, 2


@dataclass(frozen=True)
class RowPlaces:
    """Where each row of one mini-batch's x is: row k goes to x[at[k]] (x[k] when `at` is
    empty) from level `level[k]` (DEVICE: the device slice, HotCache.device_data; HOST: the
    host cache, HotCache.data; COLD: the mega-batch buffer, the rows read this window) at
    its row `slot[k]` there. The host gather reads these in one pass; a device gather takes
    each level's rows as a pair of index arrays (`of`)."""

    at: np.ndarray
    level: np.ndarray  # int8
    slot: np.ndarray  # int64

    def of(self, level: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions in x, rows of the level) of the rows `level` serves."""
        ks = np.flatnonzero(self.level == level)
        return (ks if not len(self.at) else self.at[ks]), self.slot[ks]

    def counts(self) -> dict[str, int]:
        """Rows of x served by each level (the loader's stats)."""
        served = np.bincount(self.level, minlength=3)
        return {"rows_device": int(served[DEVICE]), "rows_host_cache": int(served[HOST]),
                "rows_read": int(served[COLD])}


@nb.njit(cache=True, nogil=True)
def _places(index, level_slot, num_hot, level, slot):
    """RowPlaces' level and slot of x rows [hot members | buffer][index[k]];
    level_slot[s]: member s's host slot, or -1 - its device slot. One thread: a few ns a
    row (~1 ms a mini-batch); a parallel region per call cost ~15x that in CPU on cores
    shared with the packers (its workers' wake-ups and barrier, measured in the loader)."""
    for k in range(index.shape[0]):
        i = index[k]
        if i >= num_hot:
            level[k], slot[k] = COLD, i - num_hot
        elif level_slot[i] < 0:
            level[k], slot[k] = DEVICE, -1 - level_slot[i]
        else:
            level[k], slot[k] = HOST, level_slot[i]


class HotRanking:
    """The store's rows in decreasing sampling heat, ranked once (on first use) and cut at
    any count: the loader sizes its buffers with one count and fills the cache with another."""

    def __init__(self, store: Store, fanouts: np.ndarray):
        self.store, self.fanouts = store, fanouts

    @functools.cached_property
    def _order(self) -> np.ndarray | None:
        """Rows hottest first; None when the store's order already put them first: a
        hot-first order over one featured type. With several, each type's hottest rows
        lead its own range (a typed order keeps the types' ranges), so rows are ranked."""
        order = ORDERS.get(self.store.manifest["order"])
        featured_types = sum(t.features for t in self.store.schema.node_types)
        if order is not None and order.hot_first and featured_types == 1:
            return None
        train = np.asarray(self.store.train_store_ids)  # empty in a link store: seeds are anywhere
        # only the featured node types have rows (a prefix of the IDs): rank those
        return hot_order(self.store.indptr, self.store.indices, self.fanouts, train if len(train) else None,
                         rows=self.store.feature_rows)

    def top(self, count: int) -> np.ndarray:
        """The `count` hottest rows, sorted; the front of the file when the store's order
        already put the hottest rows first (one sequential read)."""
        count = min(count, self.store.feature_rows)
        if count == 0:
            return np.empty(0, np.int64)
        if self._order is None:
            return np.arange(count, dtype=np.int64)
        return np.sort(self._order[:count]).astype(np.int64)


class HotCache:
    """Rows `rows` of the row source `fallback`, read from it once (through the SSD reader:
    checksummed like every read) and held for the run; members.rows[s] is member slot s.
    Those of `device_rows` (a subset of `rows`: the hottest slice) are held on `device` in
    `device_data` (a CPU tensor when `device` is the CPU), the others in host memory in
    `data` (page-locked with `pinned`, so a GPU reads it in place). `read(ids)` serves the
    held rows and asks `fallback` for the rest."""

    def __init__(self, fallback: RowSource, rows: np.ndarray, num_rows: int, device_rows: np.ndarray = NO_ROWS,
                 device: torch.device | None = None, pinned: bool = False):
        self.fallback = fallback
        self.feat_dim, self.dtype, self.row_bytes = fallback.feat_dim, fallback.dtype, fallback.row_bytes
        self.members = HotRows.of(rows, num_rows)
        on_device = np.isin(self.members.rows, device_rows)
        if np.count_nonzero(on_device) != len(np.unique(device_rows)):
            raise ValueError("the device slice's rows must be among the hot rows")
        # each member's place: its host slot, or -1 - its device slot (RowPlaces)
        self._level_slot = np.empty(len(self.members.rows), np.int64)
        self._level_slot[~on_device] = np.arange(np.count_nonzero(~on_device))
        self._level_slot[on_device] = -1 - np.arange(np.count_nonzero(on_device))
        self.data = self._filled_host(self.members.rows[~on_device], pinned)
        self.device_data: torch.Tensor | None = None
        if on_device.any():
            self.device_data = self._filled_device(self.members.rows[on_device], device)

    def _chunks(self, rows: np.ndarray) -> Iterator[tuple[slice, np.ndarray]]:
        """`rows` read through the fallback FILL_BYTES at a time: (where in `rows`, the rows)."""
        step = max(1, FILL_BYTES // self.row_bytes)
        return ((slice(lo, lo + step), self.fallback.read(rows[lo:lo + step])) for lo in range(0, len(rows), step))

    def _filled_host(self, rows: np.ndarray, pinned: bool) -> np.ndarray:
        """The host level: read at once, or into page-locked memory a chunk at a time."""
        if not pinned:
            return self.fallback.read(rows)
        data = pinned_empty(len(rows) * self.row_bytes).view(self.dtype).reshape(len(rows), self.feat_dim)
        for part, chunk in self._chunks(rows):
            data[part] = chunk
        return data

    def _filled_device(self, rows: np.ndarray, device: torch.device) -> torch.Tensor:
        """The device level: a tensor on `device`, filled a chunk at a time."""
        import torch

        data = torch.empty((len(rows), self.feat_dim), dtype=torch.from_numpy(np.empty(0, self.dtype)).dtype,
                           device=device)
        for part, chunk in self._chunks(rows):
            data[part] = torch.from_numpy(chunk)
        return data

    def places(self, index: np.ndarray, positions: np.ndarray = NO_ROWS) -> RowPlaces:
        """Where each row of an x is, for x rows [hot members | buffer][index[k]] at
        positions[k] of x (k when `positions` is empty): a plan's gather indices (its
        num_hot is len(self)), or any index of that form."""
        index = np.asarray(index, np.int64)
        places = RowPlaces(np.asarray(positions, np.int64), np.empty(len(index), np.int8),
                           np.empty(len(index), np.int64))
        _places(index, self._level_slot, len(self.members.rows), places.level, places.slot)
        return places

    def read(self, ids: np.ndarray) -> np.ndarray:
        if not len(self):
            return self.fallback.read(ids)
        ids = np.asarray(ids, np.int64)
        slot = self._slot_of[ids]
        cold = slot < 0
        # the cold rows as a buffer of their own: ids[cold] in order after the members
        index = np.where(cold, len(self.members.rows) + np.cumsum(cold) - 1, slot)
        places = self.places(index)
        out = np.empty((len(ids), self.feat_dim), self.dtype)
        at, slots = places.of(HOST)
        out[at] = self.data[slots]
        at, slots = places.of(DEVICE)
        if len(at):
            out[at] = self.device_data[slots].cpu().numpy()
        out[places.of(COLD)[0]] = self.fallback.read(ids[cold])
        return out

    @functools.cached_property
    def _slot_of(self) -> np.ndarray:
        """Each row's member slot (-1: not held), 4 B per row: built on the first
        `read`, which layer-wise inference calls per chunk; training's gather indexes
        members by plan and never builds it."""
        slot = np.full(self.members.num_rows, -1, np.int32)
        slot[self.members.rows] = np.arange(len(self.members.rows), dtype=np.int32)
        return slot

    def __len__(self) -> int:
        """Rows held, on both levels: the members."""
        return len(self.members.rows)

    @property
    def nbytes(self) -> int:
        """Host memory the rows take (the device slice's is on the device)."""
        return self.data.nbytes

    @property
    def device_nbytes(self) -> int:
        return 0 if self.device_data is None else len(self.device_data) * self.row_bytes
