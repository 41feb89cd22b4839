"""`features: memory`: the reference loader, the plain DGL way.

Features sit in RAM as one tensor; DGL's NeighborSampler makes the blocks of gnnssd's
seed batches (`gnnssd.sampler.seed_batches`: the same seeds as every other mode), on a
heterogeneous store from its DGLHeteroGraph with a fanout per relation; each mini-batch's
inputs are gathered by indexing. Every other mode is measured against this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import dgl
import numpy as np
import torch

from gnnssd.core import SamplerConfig, SSDConfig, StageTimer, epoch_seed
from gnnssd.sampler import csc_edge_ids
from gnnssd.storage_format import Store

from ..typed import dgl_fanouts, global_ids, layer_fanouts, relation_edge_ids, seeds_by_type, split_features
from ..types import IOCounters, Labels, MiniBatch, check_memory, load_features, store_graph


class SampledLoader:
    """DGL sampling over the store's graph plus a subclass's `_inputs(rows)`: the loaders
    that fetch features per mini-batch (memory here; mmap and per-row in baselines).

    DGL's sampler draws from DGL's global RNG, reseeded from (seed, epoch) at the start of
    each epoch's mini-batches, as the ssd pipeline's draws are; they repeat when DGL runs
    on one thread (Config.deterministic); with more, its parallel loops vary them.
    """

    #: What this backend can do (gnnssd.loading.feature_source.FeatureBackend): the features
    #: in RAM, no budget or scratch of its own; edge mini-batches by DGL's exclude_eids.
    OUT_OF_CORE = False
    MEMORY_BUDGET = False
    SCRATCH = False
    EDGE_BATCHES = True

    #: How DGL samples: "uniform" (its NeighborSampler) or "labor" (its LaborSampler,
    #: layer-neighbour sampling); `open` sets the source's `sampling.method`.
    method = "uniform"

    #: `features=` name of the mode, for its errors.
    NAME = "memory"

    def __init__(self, store: Store, device: torch.device, timer: StageTimer, seed: int = 0):
        self.store, self.seed = store, seed
        check_memory(store, self.NAME, self._memory_needs(store))
        self.graph = store_graph(store) if store.schema.is_homogeneous else store.graph(store_ids=True)
        self.labels = Labels(store)
        self.device = device
        self.timer = timer
        self.io = IOCounters()

    def minibatches(self, batches: list[np.ndarray], fanouts: list[int] | list[dict[str, int]], epoch: int = 0,
                    exclude: list[np.ndarray] | None = None, reuse_epochs: int = 1) -> Iterator[MiniBatch]:
        """A mini-batch per array of seed nodes, sampled by DGL's NeighborSampler; with
        `exclude`, batch b without the edges of the (E, 2) node pairs exclude[b] and their
        reverses (DGL's `exclude_eids`; edge mini-batches, see gnnssd.loading.edge_loader).
        `reuse_epochs` changes nothing here: the same epoch draws the same neighbours again."""
        if exclude is not None and len(exclude) != len(batches):
            raise ValueError(f"exclude lists {len(exclude)} edge sets for {len(batches)} mini-batches")
        schema = self.store.schema
        typed = not schema.is_homogeneous  # DGL's IDs by node type, and a fanout per relation
        dgl.seed(epoch_seed(self.seed, epoch))  # before the sampler: DGL's LaborSampler draws its seed when made
        sampler = self._dgl_sampler([dgl_fanouts(schema, f) for f in layer_fanouts(schema, fanouts)])
        for b, seeds in enumerate(batches):
            with self.timer.stage("sample"):
                excluded = None  # else the pairs' edges in either direction, per relation on a typed store
                if exclude is not None:
                    excluded = relation_edge_ids(self.graph, schema, exclude[b]) if typed else torch.from_numpy(
                        csc_edge_ids(self.store.indptr, self.store.indices, exclude[b]))
                input_nodes, output_nodes, blocks = sampler.sample(
                    self.graph, seeds_by_type(schema, seeds) if typed else torch.from_numpy(seeds),
                    exclude_eids=excluded)
            x = self._typed_inputs(input_nodes) if typed else self._inputs(input_nodes.numpy())
            with self.timer.stage("transfer"):
                y = self.labels[torch.from_numpy(global_ids(schema, output_nodes)) if typed else output_nodes]
                batch = MiniBatch(input_nodes, output_nodes, blocks, x, y).to(self.device, non_blocking=True)
            yield batch

    def _typed_inputs(self, input_nodes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """x of a typed mini-batch's featured types, gathered by `_inputs` from their global rows."""
        schema = self.store.schema
        featured = {t.name: input_nodes[t.name] for t in schema.node_types if t.features}
        return split_features(schema, input_nodes, self._inputs(global_ids(schema, featured)))

    @classmethod
    def open(cls, store: Store, ssd: SSDConfig, sampling: SamplerConfig, seed: int, device: torch.device,
             timer: StageTimer, scratch_dir: Path | None) -> SampledLoader:
        """The registry's uniform constructor (gnnssd.loading.feature_source.BACKENDS)."""
        return cls(store, device, timer, seed).sampling_by(sampling.method)

    def sampling_by(self, method: str) -> SampledLoader:
        """This loader, sampling by `method` (uniform or labor)."""
        self.method = method
        return self

    def _dgl_sampler(self, fanouts: list[Any]) -> dgl.dataloading.BlockSampler:
        """DGL's sampler of this loader's `method` with `fanouts` (per layer)."""
        if self.method == "labor":
            return dgl.dataloading.LaborSampler(fanouts)
        return dgl.dataloading.NeighborSampler(fanouts)

    def io_stats(self) -> dict[str, int]:
        return self.io.as_dict()

    def _memory_needs(self, store: Store) -> dict[str, int]:
        """Bytes this loader holds in RAM, by part: DGL's int64 topology (subclasses add
        what they keep; labels are read per mini-batch: types.Labels)."""
        if store.schema.is_homogeneous:
            topology = {"topology as int64": 8 * (store.num_nodes + 1 + store.num_edges)}
        else:  # DGL's heterograph: int64 COO per relation, then the CSC its sampler builds
            topology = {"topology as a DGL heterograph": 8 * store.num_nodes + 40 * store.num_edges}
        return topology

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        raise NotImplementedError

    def _as_float32(self, raw: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """Rows `rows` in the store's dtype as the float32 tensor the models take."""
        return torch.from_numpy(self.store.as_float32(raw, rows))

    def close(self) -> None:
        """Nothing to release by default."""


class MemoryLoader(SampledLoader):
    """The whole feature matrix in RAM; inputs gathered by indexing."""

    def _memory_needs(self, store: Store) -> dict[str, int]:
        raw = store.manifest["files"]["features.bin"]["size"]  # read whole, then converted
        float32 = 4 * store.feature_rows * store.feat_dim
        return {**super()._memory_needs(store),
                "features as float32": float32 + (raw if store.feat_dtype != np.float32 else 0)}

    def __init__(self, store: Store, device: torch.device, timer: StageTimer, seed: int = 0):
        super().__init__(store, device, timer, seed)
        self.features = load_features(store)
        self.io.add(bytes_read=store.feature_bytes)

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        with self.timer.stage("gather"):
            return self.features[torch.from_numpy(rows)]
