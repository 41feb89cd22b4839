"""Edge mini-batches for link prediction: positives, seeded negatives, and the blocks and
features of all their endpoints, with the batch's own edges excluded from sampling.

`EdgeLoader` has the shape of `gnnssd.NodeLoader` (constructor options, context manager,
`set_epoch`, `len`, `io_stats`, `stage_times`, `close`). Its two feature modes sit on
today's node loaders: `memory` samples with DGL over the store graph (the batch's edges
passed to DGL as `exclude_eids`); `ssd` runs the planner / SSDLoader pipeline on the
batches' endpoint sets (`SSDLoader.minibatches_of`), its numba sampler excluding the same
edges, so edge mini-batches are planned ahead like node mini-batches.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import dgl
import numba as nb
import numpy as np
import torch

from gnnssd.sampler.sampling import exclusion_keys
from gnnssd.storage_format import Store
from gnnssd.storage_format.link_split import random_negatives

from .config import Config, ModelConfig, SamplerConfig, SSDConfig
from .memory_loader import Batch, MemoryLoader
from .ssd_loader import SSDLoader
from .timing import StageTimer


@dataclass
class EdgeBatch:
    """One edge mini-batch; `pos` (B, 2) and `neg` (B * k, 2) index `output_nodes`."""

    input_nodes: torch.Tensor
    output_nodes: torch.Tensor
    blocks: list[dgl.DGLGraph]
    x: torch.Tensor
    pos: torch.Tensor
    neg: torch.Tensor


@dataclass
class EdgeGroup:
    """What is fixed before sampling: the endpoints (sorted, unique) and the pairs."""

    seeds: np.ndarray
    pos_edges: np.ndarray  # (B, 2) store IDs
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


@nb.njit(cache=True)
def _find_in_edges(indptr, indices, dst, src, out):
    """out[:count] = CSC positions of the in-edges src[i] -> dst[i] present in the graph."""
    count = 0
    for i in range(dst.shape[0]):
        lo, hi = indptr[dst[i]], indptr[dst[i] + 1]
        at = lo + np.searchsorted(indices[lo:hi], src[i])
        if at < hi and indices[at] == src[i]:
            out[count] = at
            count += 1
    return count


def csc_edge_ids(store: Store, pairs: np.ndarray) -> np.ndarray:
    """Edge IDs (CSC positions, as in the store graph of memory mode) of the pairs (u, v)
    and (v, u) that are in the graph."""
    n = store.num_nodes
    _, keys = exclusion_keys([pairs], n, 1)  # dst * n + src, both directions
    out = np.empty(len(keys), np.int64)
    count = _find_in_edges(np.asarray(store.indptr), np.asarray(store.indices), keys // n,
                           (keys % n).astype(store.indices.dtype), out)
    return out[:count]


class EdgeLoader:
    """Edge mini-batches of `edges` (store IDs) with `negatives` negatives per positive.

    Each batch's positive edges and their reverses are excluded from its sampled blocks
    (DGL's exclude="reverse_id"), so no batch sees the edges it is asked to predict.
    """

    def __init__(self, store: Store | str | Path, edges: Any, fanouts: list[int], batch_size: int,
                 negatives: int = 1, features: str = "memory", memory_budget: int | str = "1GiB",
                 shuffle: bool = True, seed: int = 0, device: str | torch.device = "cpu",
                 eval_fanouts: list[int] | None = None, eval_batch_size: int = 4096,
                 ssd: SSDConfig | None = None, scratch_dir: str | Path | None = None):
        self.store = store if isinstance(store, Store) else Store.open(store)
        self.edges = as_edge_array(edges)
        bad = self.edges[(self.edges < 0) | (self.edges >= self.store.num_nodes)]
        if bad.size:
            raise ValueError(f"edges: node {bad[0]} outside 0..{self.store.num_nodes - 1}")
        if features not in ("memory", "ssd"):
            raise ValueError(f"features {features!r}: expected 'memory' or 'ssd'")
        if batch_size < 1 or negatives < 1:
            raise ValueError(f"batch_size {batch_size} and negatives {negatives}: both must be >= 1")
        self.fanouts, self.batch_size, self.negatives = list(fanouts), batch_size, negatives
        self.features, self.shuffle, self.seed = features, shuffle, seed
        self.device = torch.device(device)
        self.epoch = 0
        self.timer = StageTimer()
        if features == "memory":
            self.nodes: MemoryLoader | SSDLoader = MemoryLoader(self.store, self.device, self.timer)
            self._dgl_sampler = dgl.dataloading.NeighborSampler(self.fanouts)
        else:
            seeds_per_batch = min(self.store.num_nodes, batch_size * (2 + negatives))
            config = Config(
                store=str(self.store.path), run_dir=".", features="ssd", seed=seed, task="link",
                model=ModelConfig(layers=len(self.fanouts)),
                sampler=SamplerConfig(fanouts=self.fanouts, batch_size=seeds_per_batch,
                                      eval_fanouts=eval_fanouts, eval_batch_size=eval_batch_size),
                ssd=ssd or SSDConfig(memory_budget=memory_budget))
            self._scratch = None if scratch_dir else tempfile.TemporaryDirectory(prefix="gnnssd-edges-")
            blocks = Path(scratch_dir or self._scratch.name) / "blocks"
            self.nodes = SSDLoader(self.store, config, self.device, self.timer, blocks)

    # --- the loader protocol -----------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Batches and negatives of the next iteration are those of `epoch`."""
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-len(self.edges) // self.batch_size)

    def __iter__(self) -> Iterator[EdgeBatch]:
        groups = edge_groups(self.edges, self.batch_size, self.negatives, self.store.num_nodes,
                             self.seed, self.epoch, self.shuffle)
        batches = (self._memory_batches(groups) if self.features == "memory" else
                   self.nodes.minibatches_of([g.seeds for g in groups], self.fanouts, self.epoch,
                                             [g.pos_edges for g in groups]))
        for group, batch in zip(groups, batches):
            yield EdgeBatch(batch.blocks[0].srcdata[dgl.NID], batch.output_nodes, batch.blocks, batch.x,
                            torch.from_numpy(group.pos), torch.from_numpy(group.neg))

    def node_batches(self, nodes: np.ndarray, fanouts: list[int], batch_size: int) -> Iterator[Batch]:
        """Node mini-batches through the same features (evaluation embeddings)."""
        return self.nodes.batches(np.asarray(nodes), fanouts, batch_size, shuffle=False, epoch=self.epoch)

    def io_stats(self) -> dict[str, int]:
        """Bytes and requests sent to the disk since the last call (ssd mode)."""
        if isinstance(self.nodes, SSDLoader):
            return self.nodes.io_counts.take()
        return {"bytes_read": 0, "bytes_written": 0, "requests": 0}

    def stage_times(self) -> dict[str, float]:
        """Seconds per pipeline stage since the last call."""
        return self.timer.take()

    def close(self) -> None:
        self.nodes.close()
        if getattr(self, "_scratch", None) is not None:
            self._scratch.cleanup()

    def __enter__(self) -> "EdgeLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- memory mode ---------------------------------------------------------------------

    def _memory_batches(self, groups: list[EdgeGroup]) -> Iterator[Batch]:
        loader = self.nodes
        assert isinstance(loader, MemoryLoader)
        for group in groups:
            with self.timer.stage("sample"):
                exclude = torch.from_numpy(csc_edge_ids(self.store, group.pos_edges))
                input_nodes, output_nodes, blocks = self._dgl_sampler.sample_blocks(
                    loader.graph, torch.from_numpy(group.seeds), exclude_eids=exclude)
            x = loader._inputs(input_nodes.long().numpy())
            with self.timer.stage("transfer"):
                x = x.to(self.device)
                blocks = [b.to(self.device) for b in blocks]
            yield Batch(blocks, x, output_nodes.long())
