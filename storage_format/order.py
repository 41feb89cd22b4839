"""Node orders as the store sees them: which node gets which row of features.bin.

The store lays rows out by a permutation it is handed (perm[store_id] = original_id)
and records the order's name; orders other than the original are computed by the
planner (`gnnssd.sampler.node_order`), which knows how rows are accessed, so this layer
imports nothing above it.
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from .errors import DatasetError


class NodeOrder(Protocol):
    name: str
    permutation: Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]


def order_name(order: str | NodeOrder) -> str:
    """The name the manifest records: "original" by name, any other as a NodeOrder."""
    if not isinstance(order, str):
        return order.name
    if order != "original":
        raise DatasetError(f"order {order!r}: the store computes only 'original'; pass "
                           f"gnnssd.sampler.node_order({order!r}) for the planner's orders")
    return order


def resolve_order(order: str | NodeOrder, indptr: np.ndarray, indices: np.ndarray,
                  train_idx: np.ndarray) -> tuple[str, np.ndarray]:
    """(name, perm) of `order` over the graph (indptr, indices)."""
    n = indptr.shape[0] - 1
    if isinstance(order, str):
        return order_name(order), np.arange(n, dtype=np.int64)
    perm = np.asarray(order.permutation(indptr, indices, train_idx), dtype=np.int64)
    if perm.shape != (n,) or not _is_permutation(perm, n):
        raise DatasetError(f"order {order.name!r}: not a permutation of the {n:,} nodes")
    return order.name, perm


def _is_permutation(perm: np.ndarray, n: int) -> bool:
    """Every node exactly once (a linear-time count, not a sort of n keys)."""
    if n == 0:
        return True
    if perm.min() < 0 or perm.max() >= n:
        return False
    return bool(np.all(np.bincount(perm, minlength=n) == 1))
