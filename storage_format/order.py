"""Node orders for the store: which node gets which row of features.bin.

An order is a permutation `perm` with perm[store_id] = original_id. The orders
themselves are computed by the planner's module (`gnnssd.sampler.order`), which knows
how rows are accessed; this is the store's list of them.
"""
from __future__ import annotations

import numpy as np

ORDERS = ("original", "degree", "locality")


def compute_order(name: str, indptr: np.ndarray, indices: np.ndarray,
                  train_idx: np.ndarray | None = None) -> np.ndarray:
    """The permutation for order `name` (one of ORDERS).

    degree: most-referenced rows first. locality: the hottest 5% of rows (expected
    sampling frequency from `train_idx` with fanouts 15,10,5) first, then the rest grouped
    by graph community so that rows sampled together share pages.
    """
    from gnnssd.sampler.order import degree_order, locality_order

    if name == "original":
        return np.arange(indptr.shape[0] - 1, dtype=np.int64)
    if name == "degree":
        return degree_order(indptr, indices)
    if name == "locality":
        return locality_order(indptr, indices, hot_fraction=0.05, fanouts=(15, 10, 5), seeds=train_idx)
    raise ValueError(f"order {name!r}: expected one of {ORDERS}")
