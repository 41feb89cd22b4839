"""The hot cache: the feature rows sampling reaches most, held in memory for the whole run.

It is the one owner of which rows are hot. It wraps a row source, its fallback (the SSD
reader in training, a layer's file in layer-wise inference), as GraphBolt's cached features
wrap their fallback feature: the planner consults its membership (`members`, a sampler.HotRows: the
sorted rows and their row-sized bitset) so that hot rows are never read, and the gather
copies hot rows from `data`, the rest from the mega-batch buffer the reader filled.
"""
from __future__ import annotations

import functools

import numpy as np

from gnnssd.pipeline.row_source import RowSource
from gnnssd.sampler import ORDERS, HotRows, hot_order
from gnnssd.storage_format import Store


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
    checksummed like every read) and held for the run; row members.rows[k] is data[k].
    `read(ids)` serves the held rows from memory and asks `fallback` for the rest."""

    def __init__(self, fallback: RowSource, rows: np.ndarray, num_rows: int):
        self.fallback = fallback
        self.feat_dim, self.dtype, self.row_bytes = fallback.feat_dim, fallback.dtype, fallback.row_bytes
        self.members = HotRows.of(rows, num_rows)
        self.data = fallback.read(self.members.rows)

    def read(self, ids: np.ndarray) -> np.ndarray:
        if not len(self.data):
            return self.fallback.read(ids)
        slot = self._slot_of[ids]
        cold = slot < 0
        # one gather for every row (a cold row takes slot 0 until the fallback's row replaces it):
        # a third of the time of a masked gather and a masked store
        out = self.data.take(np.where(cold, 0, slot), axis=0)
        out[cold] = self.fallback.read(np.asarray(ids, np.int64)[cold])
        return out

    @functools.cached_property
    def _slot_of(self) -> np.ndarray:
        """Each row's slot in `data` (-1: not held), 4 B per row: built on the first
        `read`, which layer-wise inference calls per chunk; training's gather indexes
        `data` by plan and never builds it."""
        slot = np.full(self.members.num_rows, -1, np.int32)
        slot[self.members.rows] = np.arange(len(self.members.rows), dtype=np.int32)
        return slot

    def __len__(self) -> int:
        return len(self.data)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes
