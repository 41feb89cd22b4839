"""`features: memory`: the reference loader, the plain DGL way.

Features sit in RAM as one tensor; DGL's NeighborSampler and DataLoader make the
blocks; each mini-batch's inputs are gathered by indexing. Every other mode is
measured against this one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import dgl
import numpy as np
import torch

from gnnssd.storage_format import Store

from .timing import StageTimer


@dataclass
class Batch:
    blocks: list[dgl.DGLGraph]
    x: torch.Tensor
    output_nodes: torch.Tensor


def store_graph(store: Store) -> dgl.DGLGraph:
    """The store's topology as a DGL graph, built from its CSC arrays.

    The graph uses int64 IDs: with int32 IDs DGL 2.1's g-SpMM backward crashes
    (segfault) on blocks sampled from a CSC-only graph.
    """
    indptr = torch.from_numpy(np.array(store.indptr, dtype=np.int64))
    indices = torch.from_numpy(np.array(store.indices, dtype=np.int64))
    empty = torch.empty(0, dtype=torch.int64)
    return dgl.graph(("csc", (indptr, indices, empty)), num_nodes=store.num_nodes)


def load_features(store: Store) -> torch.Tensor:
    """The whole feature matrix in RAM as float32 (memory mode only), every page checked
    against the store's page checksums as it loads."""
    return torch.from_numpy(store.read_features().astype(np.float32, copy=False))


def sampled(graph: dgl.DGLGraph, nodes: np.ndarray, fanouts: list[int], batch_size: int,
            shuffle: bool, timer: StageTimer) -> Iterator[tuple[torch.Tensor, torch.Tensor,
                                                                list[dgl.DGLGraph]]]:
    """(input_nodes, output_nodes, blocks) per mini-batch from DGL's NeighborSampler and
    DataLoader; sampling time goes to "sample".

    The draws repeat for a given dgl.seed when DGL runs on one thread (Config.deterministic);
    with more threads the sampler's parallel loops make them vary.
    """
    sampler = dgl.dataloading.NeighborSampler(fanouts)
    ids = torch.from_numpy(np.array(nodes, dtype=np.int64))  # a copy: store arrays are read-only
    iterator = iter(dgl.dataloading.DataLoader(graph, ids, sampler, batch_size=batch_size,
                                               shuffle=shuffle, drop_last=False))
    while True:
        with timer.stage("sample"):
            try:
                input_nodes, output_nodes, blocks = next(iterator)
            except StopIteration:
                return
        yield input_nodes.long(), output_nodes.long(), blocks


class SampledLoader:
    """DGL sampling over the store's graph plus a subclass's `_inputs(rows)`: the loaders
    that fetch features per mini-batch (memory here; mmap and per-row in baselines)."""

    def __init__(self, store: Store, device: torch.device, timer: StageTimer):
        self.store = store
        self.graph = store_graph(store)
        self.device = device
        self.timer = timer

    def batches(self, nodes: np.ndarray, fanouts: list[int], batch_size: int,
                shuffle: bool, epoch: int = 0) -> Iterator[Batch]:
        """Mini-batches of `nodes`; the shuffle follows torch's RNG (seeded per epoch by
        the trainer), so `epoch` is not needed here."""
        for input_nodes, output_nodes, blocks in sampled(self.graph, nodes, fanouts,
                                                         batch_size, shuffle, self.timer):
            x = self._inputs(input_nodes.numpy())
            with self.timer.stage("transfer"):
                x = x.to(self.device, non_blocking=True)
                blocks = [b.to(self.device) for b in blocks]
            yield Batch(blocks, x, output_nodes)

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        raise NotImplementedError

    def _as_float32(self, raw: np.ndarray) -> torch.Tensor:
        """Rows in the store's dtype as the float32 tensor the models take."""
        return torch.from_numpy(raw.astype(np.float32, copy=False))

    def close(self) -> None:
        """Nothing to release by default."""


class MemoryLoader(SampledLoader):
    """The whole feature matrix in RAM; inputs gathered by indexing."""

    def __init__(self, store: Store, device: torch.device, timer: StageTimer):
        super().__init__(store, device, timer)
        self.features = load_features(store)

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        with self.timer.stage("gather"):
            return self.features[torch.from_numpy(rows)]
