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
    """The whole feature matrix in RAM as float32 (memory mode only)."""
    rows = np.fromfile(store.features_path, dtype=store.feat_dtype,
                       count=store.num_nodes * store.feat_dim)
    return torch.from_numpy(rows.reshape(store.num_nodes, store.feat_dim).astype(np.float32, copy=False))


class MemoryLoader:
    def __init__(self, store: Store, device: torch.device, timer: StageTimer):
        self.graph = store_graph(store)
        self.features = load_features(store)
        self.device = device
        self.timer = timer

    def batches(self, nodes: np.ndarray, fanouts: list[int], batch_size: int,
                shuffle: bool, epoch: int = 0) -> Iterator[Batch]:
        """Mini-batches of `nodes`; the shuffle follows torch's RNG (seeded per epoch by
        the trainer), so `epoch` is not needed here."""
        # DGL's fused CSC sampler draws differently from run to run with several OpenMP
        # threads; the unfused one repeats exactly for a given dgl.seed.
        sampler = dgl.dataloading.NeighborSampler(fanouts, fused=False)
        ids = torch.from_numpy(np.asarray(nodes)).to(self.graph.idtype)
        loader = dgl.dataloading.DataLoader(self.graph, ids, sampler, batch_size=batch_size,
                                            shuffle=shuffle, drop_last=False)
        iterator = iter(loader)
        while True:
            with self.timer.stage("sample"):
                try:
                    input_nodes, output_nodes, blocks = next(iterator)
                except StopIteration:
                    return
            with self.timer.stage("gather"):
                x = self.features[input_nodes.long()]
            with self.timer.stage("transfer"):
                x = x.to(self.device, non_blocking=True)
                blocks = [b.to(self.device) for b in blocks]
            yield Batch(blocks, x, output_nodes.long())

    def close(self) -> None:
        """Nothing to release: everything is in memory."""
