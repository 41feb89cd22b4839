"""Node orders for the store: which node gets which row of features.bin.

An order is a permutation `perm` with perm[store_id] = original_id. Putting rows
that are read often together at the front lets a hot cache load them in one read.
"""
from __future__ import annotations

import numpy as np

ORDERS = ("original", "degree")


def source_frequency(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """How many in-neighbour lists name each node: how often sampling can reach it."""
    return np.bincount(indices, minlength=indptr.shape[0] - 1)


def compute_order(name: str, indptr: np.ndarray, indices: np.ndarray,
                  train_idx: np.ndarray | None = None) -> np.ndarray:
    """The permutation for order `name` (one of ORDERS)."""
    n = indptr.shape[0] - 1
    if name == "original":
        return np.arange(n, dtype=np.int64)
    if name == "degree":
        # Most-referenced first; ties keep their original relative order.
        return np.argsort(-source_frequency(indptr, indices), kind="stable").astype(np.int64)
    raise ValueError(f"order {name!r}: expected one of {ORDERS}")
