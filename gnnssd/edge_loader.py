"""Edge mini-batches for link prediction: positives, seeded negatives, and the blocks and
features of all their endpoints, with the batch's own edges excluded from sampling.

`EdgeLoader` has the shape of `gnnssd.NodeLoader` (keyword options, context manager,
`set_epoch`, `len`, `io_stats`, `stage_times`, `close`) and iterates over a FeatureSource
as NodeLoader does: the seed order here is edge batches (`edge_groups`: each batch's
endpoints and negatives), and the source's backend turns them into mini-batches through
the same protocol as node batches, `backend.minibatches(seeds, fanouts, epoch,
exclude=pairs)`: memory mode through DGL's `exclude_eids`, ssd mode through the mega-batch
planner and its numba sampler, so edge mini-batches are planned ahead and read out of core
like node mini-batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from gnnssd.storage_format import Store
from gnnssd.storage_format.link_split import random_negatives

from .feature_source import FeatureSource, SourceLoader
from .memory_loader import MiniBatch
from .node_loader import NodeLoader, check_fanouts

EDGE_FEATURES = ("memory", "ssd")


@dataclass
class EdgeBatch(MiniBatch):
    """One edge mini-batch: a MiniBatch of all the endpoints (and negatives) with `pos`
    (B, 2) and `neg` (B * k, 2), index pairs into `output_nodes`."""

    pos: torch.Tensor
    neg: torch.Tensor


@dataclass
class EdgeGroup:
    """What is fixed before sampling: the endpoints (sorted, unique) and the pairs."""

    seeds: np.ndarray
    pos_edges: np.ndarray  # (B, 2) store IDs (what sampling excludes)
    pos: np.ndarray  # (B, 2) into seeds
    neg: np.ndarray  # (B * k, 2) into seeds


def as_edge_array(edges: Any) -> np.ndarray:
    """(src, dst) or an (E, 2) array -> (E, 2) int64."""
    if isinstance(edges, tuple) and len(edges) == 2:
        src, dst = (np.asarray(e, np.int64) for e in edges)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError(f"edges: source and destination arrays have shapes {src.shape} and "
                             f"{dst.shape}, expected two equal 1-D arrays")
        return np.stack([src, dst], axis=1)
    array = np.asarray(edges, np.int64)
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"edges: shape {array.shape}, expected (src, dst) or (E, 2)")
    return array


def edge_groups(edges: np.ndarray, batch_size: int, negatives: int, num_nodes: int,
                seed: int, epoch: int, shuffle: bool) -> list[EdgeGroup]:
    """The epoch's edge mini-batches: positives (permuted with (seed, epoch) when
    shuffling), `negatives` corrupted destinations each (never the positive's own)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(edges)) if shuffle else np.arange(len(edges))
    groups = []
    for lo in range(0, len(edges), batch_size):
        pos_edges = edges[order[lo:lo + batch_size]]
        neg_dst = random_negatives(pos_edges[:, 1], negatives, num_nodes, rng).ravel()
        neg_src = np.repeat(pos_edges[:, 0], negatives)
        seeds = np.unique(np.concatenate([pos_edges.ravel(), neg_dst]))
        groups.append(EdgeGroup(seeds, pos_edges, np.searchsorted(seeds, pos_edges),
                                np.searchsorted(seeds, np.stack([neg_src, neg_dst], axis=1))))
    return groups


class EdgeLoader(SourceLoader):
    """Edge mini-batches of `edges` (the dataset's node IDs, as `store.link_edges` gives
    them; (src, dst) or (E, 2)) with `negatives`
    negatives per positive, features from `source` (a FeatureSource, or a Store or its path
    for which it opens its own from `source_options`, NodeLoader's: memory_budget, device,
    eval_fanouts, scratch_dir, ...; features memory or ssd).

    Each batch's positive edges and their reverses are excluded from its sampled blocks
    (DGL's exclude="reverse_id"), so no batch sees the edges it is asked to predict.
    `drop_last` drops a last batch of fewer than `batch_size` edges.
    """

    def __init__(self, source: FeatureSource | Store | str | Path, edges: Any, *, fanouts: list[int],
                 batch_size: int, negatives: int = 1, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, **source_options: Any):
        fanouts = check_fanouts(fanouts)
        if batch_size < 1 or negatives < 1:
            raise ValueError(f"batch_size {batch_size} and negatives {negatives}: both must be >= 1")
        features = source.features if isinstance(source, FeatureSource) else source_options.get("features", "memory")
        if features not in EDGE_FEATURES:
            raise ValueError(f"features: {features!r}; expected one of {EDGE_FEATURES}")
        self._owns_source = not isinstance(source, FeatureSource)
        if self._owns_source:
            # A batch's seeds: its endpoints and negative destinations (what the buffers must hold).
            store = source if isinstance(source, Store) else Store.open(source)
            seeds_per_batch = min(store.num_nodes, batch_size * (2 + negatives))
            source = FeatureSource.from_options(store, fanouts=fanouts, batch_size=seeds_per_batch, seed=seed,
                                                **source_options)
        super().__init__(source, self._owns_source)
        try:
            self.edges = as_edge_array(edges)
            bad = self.edges[(self.edges < 0) | (self.edges >= self.store.num_nodes)]
            if bad.size:
                raise ValueError(f"edges: node {bad[0]} outside 0..{self.store.num_nodes - 1}")
        except BaseException:
            self.close()
            raise
        self.store_edges = source.store_ids(self.edges)  # what sampling and exclusion take
        self.batch_size, self.negatives, self.shuffle, self.drop_last = batch_size, negatives, shuffle, drop_last
        self.fanouts, self.seed = fanouts, source.seed

    def __len__(self) -> int:
        full, rest = divmod(len(self.edges), self.batch_size)
        return full + (0 if self.drop_last or rest == 0 else 1)

    def __iter__(self) -> Iterator[EdgeBatch]:
        groups = edge_groups(self.store_edges, self.batch_size, self.negatives, self.store.num_nodes,
                             self.seed, self.epoch, self.shuffle)[:len(self)]
        batches = self.backend.minibatches([g.seeds for g in groups], self.fanouts, self.epoch,
                                           exclude=[g.pos_edges for g in groups])
        try:  # closed here, not when collected: a caller's break stops the I/O threads now
            for group, batch in zip(groups, batches):
                batch = self.source.with_original_ids(batch)
                yield EdgeBatch(batch.input_nodes, batch.output_nodes, batch.blocks, batch.x, batch.y,
                                torch.from_numpy(group.pos), torch.from_numpy(group.neg))
        finally:
            batches.close()

    def node_batches(self, nodes: np.ndarray, fanouts: list[int], batch_size: int) -> Iterator[MiniBatch]:
        """Node mini-batches of `nodes` in order through the same source (evaluation
        embeddings)."""
        view = NodeLoader(self.source, nodes, fanouts=fanouts, batch_size=batch_size, rank=0, world_size=1)
        view.set_epoch(self.epoch)
        return iter(view)
