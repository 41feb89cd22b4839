"""`features: memory`: the reference loader, everything in RAM.

Features sit in RAM as one tensor, the topology as int64 CSC arrays; gnnssd's own
counter-based sampler (gnnssd.sampler.NeighborSampler, the one ssd mode plans with) makes
the blocks of gnnssd's seed batches (`gnnssd.sampler.seed_batches`: the same seeds as every
other mode), on a heterogeneous store with a fanout per relation; each mini-batch's
inputs are gathered by indexing. Every other mode is measured against this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from gnnssd.core import SamplerConfig, SSDConfig, StageTimer
from gnnssd.sampler import Fanouts, NeighborSampler
from gnnssd.storage_format import Store

from ..form import batch_parts
from ..typed import sampler_options
from ..types import (IOCounters, Labels, MiniBatch, check_memory, load_features, store_held, store_shared,
                     store_topology)


class SampledLoader:
    """gnnssd's sampler over the store's topology in RAM plus a subclass's `_inputs(rows)`:
    the loaders that fetch features per mini-batch (memory here; mmap and per-row in
    baselines).

    The draws are ssd mode's: counter-based, from (seed, epoch, the mini-batch's position
    in the epoch, layer, node), so they repeat under a fixed seed whatever the thread
    count, and a seed batch gets the same blocks in every mode. (DGL's samplers, which
    this loader used before, vary with more than one thread; they stay the tests'
    reference.)
    """

    #: What this backend can do (gnnssd.loading.feature_source.FeatureBackend): the features
    #: in RAM, no budget or scratch of its own; edge mini-batches by the sampler's exclusion.
    OUT_OF_CORE = False
    MEMORY_BUDGET = False
    SCRATCH = False
    EDGE_BATCHES = True

    #: How the sampler draws: "uniform" or "labor" (layer-neighbour sampling); `open` sets
    #: the source's `sampling.method`.
    method = "uniform"

    #: `features=` name of the mode, for its errors.
    NAME = "memory"

    def __init__(self, store: Store, device: torch.device, timer: StageTimer, seed: int = 0):
        self.store, self.seed = store, seed
        check_memory(store, self.NAME, {part: n for part, n in self._memory_needs(store).items()
                                        if store_held(store, part) is None})
        # the topology in RAM: shared by this Store object's loaders (types.store_shared)
        self.topology = store_shared(store, "topology as int64", lambda: _Topology(store))
        self.indptr, self.indices = self.topology.arrays
        self.etypes = store_shared(store, "edge types", lambda: np.array(store.etypes))
        self.labels = Labels(store)
        self.device = device
        self.timer = timer
        self.io = IOCounters()

    def minibatches(self, batches: list[np.ndarray], fanouts: Fanouts | list[Any], epoch: int = 0,
                    exclude: list[np.ndarray] | None = None, reuse_epochs: int = 1) -> Iterator[MiniBatch]:
        """A mini-batch per array of seed nodes, batch b drawn as ssd mode draws the
        epoch's b-th mini-batch; with `exclude`, batch b without the edges of the (E, 2)
        node pairs exclude[b] and their reverses (edge mini-batches, see
        gnnssd.loading.edge_loader). `reuse_epochs` changes nothing here: the same epoch
        draws the same neighbours again."""
        if exclude is not None and len(exclude) != len(batches):
            raise ValueError(f"exclude lists {len(exclude)} edge sets for {len(batches)} mini-batches")
        schema = self.store.schema
        sampler = NeighborSampler(self.indptr, self.indices, Fanouts.parse(fanouts).array(schema),
                                  **sampler_options(self.store, self.etypes), method=self.method)
        for b, seeds in enumerate(batches):
            with self.timer.stage("sample"):  # batch IDs as the ssd planner's (sampler.Planner)
                mfgs = sampler.sample(seeds, self.seed, (epoch << 32) + b, None if exclude is None else exclude[b])
            x = self._inputs(np.asarray(mfgs.input_rows))
            with self.timer.stage("transfer"):
                y = self.labels[torch.from_numpy(mfgs.seeds)]
                batch = MiniBatch(**batch_parts(mfgs, schema, x), y=y).to(self.device, non_blocking=True)
            yield batch

    @classmethod
    def open(cls, store: Store, ssd: SSDConfig, sampling: SamplerConfig, seed: int, device: torch.device,
             timer: StageTimer, scratch_dir: Path | None) -> SampledLoader:
        """The registry's uniform constructor (gnnssd.loading.feature_source.BACKENDS)."""
        return cls(store, device, timer, seed).sampling_by(sampling.method)

    def sampling_by(self, method: str) -> SampledLoader:
        """This loader, sampling by `method` (uniform or labor)."""
        self.method = method
        return self

    def io_stats(self) -> dict[str, int]:
        return self.io.as_dict()

    def _memory_needs(self, store: Store) -> dict[str, int]:
        """Bytes this loader holds in RAM, by part: the int64 topology and the edge types
        (none on one relation; subclasses add what they keep; labels are read per
        mini-batch: types.Labels)."""
        return {"topology as int64": 8 * (store.num_nodes + 1 + store.num_edges), "edge types": store.etypes.nbytes}

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        raise NotImplementedError

    def _as_float32(self, raw: np.ndarray, rows: np.ndarray) -> torch.Tensor:
        """Rows `rows` in the store's dtype as the float32 tensor the models take."""
        return torch.from_numpy(self.store.as_float32(raw, rows))

    def close(self) -> None:
        """Nothing to release by default."""


class _Topology:
    """The store's checked int64 CSC (types.store_topology), as one shared value."""

    def __init__(self, store: Store):
        self.arrays = store_topology(store)


class MemoryLoader(SampledLoader):
    """The whole feature matrix in RAM; inputs gathered by indexing."""

    def _memory_needs(self, store: Store) -> dict[str, int]:
        raw = store.manifest["files"]["features.bin"]["size"]  # read whole, then converted
        float32 = 4 * store.feature_rows * store.feat_dim
        return {**super()._memory_needs(store),
                "features as float32": float32 + (raw if store.feat_dtype != np.float32 else 0)}

    def __init__(self, store: Store, device: torch.device, timer: StageTimer, seed: int = 0):
        super().__init__(store, device, timer, seed)
        loaded = store_held(store, "features as float32") is None
        self.features = store_shared(store, "features as float32", lambda: load_features(store))
        if loaded:  # a loader sharing another's features read nothing
            self.io.add(bytes_read=store.feature_bytes)

    def _inputs(self, rows: np.ndarray) -> torch.Tensor:
        with self.timer.stage("gather"):
            return self.features[torch.from_numpy(rows)]
