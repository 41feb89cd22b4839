"""Node orders as the store sees them: which node gets which row of features.bin.

The store lays rows out by a permutation it is handed (perm[store_id] = original_id)
and records the order's name; orders other than the original are computed by the
planner (`gnnssd.sampler.node_order`), which knows how rows are accessed, so this layer
imports nothing above it.

A heterogeneous store keeps each node type a contiguous range in the schema's order
(storage_format.schema), so any order is computed over the whole graph (every relation,
as one topology) and then kept within each type: a type's nodes in the order's relative
order, the types where they were (`within_types`).
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ..errors import DatasetError


class Permutation(Protocol):
    """What write_store takes for a node order: a name the manifest records and the
    permutation's function. gnnssd.sampler.NodeOrder (the planner's orders) is one; this
    layer only names the shape it needs, so it imports nothing above it."""

    name: str
    permutation: Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]


def order_name(order: str | Permutation) -> str:
    """The name the manifest records: "original" by name, any other by its own name."""
    if not isinstance(order, str):
        return order.name
    if order != "original":
        raise DatasetError(f"order {order!r}: the store computes only 'original'; pass "
                           f"gnnssd.sampler.node_order({order!r}) for the planner's orders")
    return order


def resolve_order(order: str | Permutation, indptr: np.ndarray, indices: np.ndarray,
                  train_idx: np.ndarray, type_offsets: np.ndarray | None = None) -> tuple[str, np.ndarray]:
    """(name, perm) of `order` over the graph (indptr, indices); with `type_offsets`
    (a typed graph's schema.offsets) kept within each node type."""
    n = indptr.shape[0] - 1
    if isinstance(order, str):
        return order_name(order), np.arange(n, dtype=np.int64)
    perm = np.asarray(order.permutation(indptr, indices, train_idx), dtype=np.int64)
    if perm.shape != (n,) or not _is_permutation(perm, n):
        raise DatasetError(f"order {order.name!r}: not a permutation of the {n:,} nodes")
    if type_offsets is not None:
        perm = within_types(perm, type_offsets)
    return order.name, perm


def within_types(perm: np.ndarray, type_offsets: np.ndarray) -> np.ndarray:
    """`perm` with every node type's nodes moved into that type's range, in the relative
    order `perm` gives them (a stable partition by type: one pass per type)."""
    return np.concatenate([perm[(perm >= lo) & (perm < hi)]
                           for lo, hi in zip(type_offsets[:-1].tolist(), type_offsets[1:].tolist())])


def _is_permutation(perm: np.ndarray, n: int) -> bool:
    """Every node exactly once (a linear-time count, not a sort of n keys)."""
    if n == 0:
        return True
    if perm.min() < 0 or perm.max() >= n:
        return False
    return bool(np.all(np.bincount(perm, minlength=n) == 1))
