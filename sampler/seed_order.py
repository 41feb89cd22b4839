"""Seed orders: the order in which an epoch visits its seed nodes, and its mini-batches.

One policy object per order, as ffcv's traversal orders are: `Sequential`, `Shuffled`,
`Proximity` and `Sharded` (a rank's share of another order). An order is drawn from
(seed, epoch) alone, so every loader (memory, ssd, baselines) and every data-parallel rank
computes the same one; the planner then takes the batches it is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np


def checked_order(ordered: object, seeds: np.ndarray, policy: str) -> np.ndarray:
    """A policy's output as a contiguous int64 array, refused (ValueError naming the value)
    unless it is 1-D integer node IDs within the range of the seeds it was given: a custom
    order's float (truncated), negative or huge ID would otherwise be read as another node,
    or index past the graph in the sampler's native code."""
    array = np.asarray(ordered)
    if array.size and (array.ndim != 1 or array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer)):
        example = array.reshape(-1)[0] if array.size else None
        raise ValueError(f"seed_order {policy}: returned {array.dtype} of shape {array.shape} (e.g. "
                         f"{example!r}); a seed order returns a 1-D array of integer node IDs")
    if array.size:
        low, high = (int(seeds.min()), int(seeds.max())) if seeds.size else (0, -1)
        bad = array[(array < low) | (array > high)]
        if bad.size:
            raise ValueError(f"seed_order {policy}: returned node {bad[0]}, outside the seeds it was "
                             f"given ({low}..{high}); a seed order may only reorder its seeds")
    return np.ascontiguousarray(array, dtype=np.int64)


class SeedOrder:
    """An epoch's order of seeds. Subclasses implement `_order`; users may pass their own
    to NodeLoader (`seed_order=`)."""

    name: ClassVar[str]

    def order(self, seeds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        """`seeds` in this epoch's order, drawn from (seed, epoch) only (a contiguous int64
        array, whatever view a subclass returns), checked by `checked_order`."""
        seeds = np.asarray(seeds, dtype=np.int64)
        return checked_order(self._order(seeds, seed, epoch), seeds, type(self).__name__)

    def _order(self, seeds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        raise NotImplementedError


class Sequential(SeedOrder):
    """The seeds in the order given (evaluation, inference)."""

    name = "sequential"

    def _order(self, seeds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        return seeds


class Shuffled(SeedOrder):
    """A uniformly random permutation per epoch."""

    name = "random"

    def _order(self, seeds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(seeds)


@dataclass(frozen=True)
class Proximity(SeedOrder):
    """Proximity-aware order (after BGL, NSDI'23): the sorted seeds, rotated by a random
    offset, are cut into runs of `window`; the runs are visited in random order and each is
    shuffled. Consecutive mini-batches then draw from nearby store IDs, which under a
    locality node order (metis, locality) are graph neighbours: a mega-batch's rows overlap
    more and sit closer on disk, while every seed still comes once per epoch."""

    window: int
    name: ClassVar[str] = "proximity"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"seed_window: {self.window}; expected a positive integer")

    def _order(self, seeds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([seed, epoch])
        if not len(seeds):
            return seeds
        ordered = np.roll(np.sort(seeds), -int(rng.integers(len(seeds))))
        runs = [ordered[i : i + self.window] for i in range(0, len(ordered), self.window)]
        return np.concatenate([rng.permutation(runs[r]) for r in rng.permutation(len(runs))])


@dataclass(frozen=True)
class Sharded(SeedOrder):
    """Rank `rank`'s share of `inner`'s order, the same order on every rank (see `shard`)."""

    inner: SeedOrder
    rank: int
    world_size: int
    name: ClassVar[str] = "sharded"

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside 0..{self.world_size - 1}")

    def _order(self, seeds: np.ndarray, seed: int, epoch: int) -> np.ndarray:
        order = self.inner.order(seeds, seed, epoch)
        return shard(order, self.rank, self.world_size) if len(order) else order


#: The orders a config or NodeLoader names (`sampler.seed_order`); a window-free order is
#: built with no arguments, `proximity` with its window.
SEED_ORDERS = {"random": Shuffled, "proximity": Proximity}


def named_order(name: str, window: int) -> SeedOrder:
    """The training order called `name` (`window`: proximity's run length)."""
    if name not in SEED_ORDERS:
        raise ValueError(f"seed_order: {name!r}; expected one of {tuple(SEED_ORDERS)}")
    return Proximity(window) if name == "proximity" else SEED_ORDERS[name]()


def shard(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank `rank`'s equal share of `order`, as torch's DistributedSampler deals it: padded
    by wrapping to a multiple of `world_size`, then every `world_size`-th seed.

    Every rank gets ceil(n / world_size) seeds, hence the same number of mini-batches of a
    given size; and mini-batch k of all ranks together is the k-th run of
    world_size * batch_size seeds of the (padded) order.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    if len(order) == 0:
        raise ValueError("no seeds to shard")
    total = -(-len(order) // world_size) * world_size
    padded = np.resize(np.asarray(order), total)  # np.resize repeats from the start
    return padded[rank::world_size]


def seed_batches(seeds: np.ndarray, batch_size: int, order: SeedOrder, seed: int, epoch: int,
                 drop_last: bool = False) -> list[np.ndarray]:
    """An epoch's mini-batches of seed nodes, in training order: `order`'s order of `seeds`
    for (seed, epoch), cut into batches of `batch_size` (the last one short unless
    `drop_last`)."""
    ordered = order.order(seeds, seed, epoch)
    stop = len(ordered) - len(ordered) % batch_size if drop_last else len(ordered)
    return [ordered[i : i + batch_size] for i in range(0, stop, batch_size)]
