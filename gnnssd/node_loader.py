"""`gnnssd.NodeLoader`: the mini-batches of a user's own training loop, from any loader.

    with gnnssd.NodeLoader(store, store.train_idx, fanouts=[10, 10], batch_size=256,
                           features="ssd", memory_budget="256MiB", shuffle=True) as loader:
        for epoch in range(5):
            loader.set_epoch(epoch)
            for mb in loader:
                loss = F.cross_entropy(model(mb.blocks, mb.x), mb.y)

The data path is two steps, kept apart on purpose: `seed_batches` (gnnssd.sampler) turns
(seeds, batch size, shuffle, seed, epoch) into the epoch's list of seed batches, the same
for every mode; a feature backend (memory, ssd, mmap, per-row: the protocol in
memory_loader) turns a list of seed batches into `MiniBatch`es. Other seed orders plug in
at that seam: a data-parallel rank's share (`rank`/`world_size`), edge mini-batches
(gnnssd.edge_loader).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np
import torch

from gnnssd.sampler import seed_batches
from gnnssd.storage_format import Store

from .budget import parse_bytes
from .config import SamplerConfig, SSDConfig
from .memory_loader import MemoryLoader, MiniBatch
from .runtime import run_seed, select_device
from .timing import StageTimer

FEATURES = ("memory", "ssd", "mmap", "per-row")
SEED_ORDERS = ("random", "proximity")
_SSD = SSDConfig()


class FeatureBackend(Protocol):
    """What NodeLoader drives: a mini-batch per seed batch, disk counters, release."""

    timer: StageTimer

    def minibatches(self, batches: list[np.ndarray], fanouts: list[int], epoch: int = 0,
                    exclude: list[np.ndarray] | None = None, reuse_epochs: int = 1) -> Iterator[MiniBatch]:
        ...

    def io_stats(self) -> dict[str, int]:
        ...

    def close(self) -> None:
        ...


class NodeLoader:
    """Mini-batches of `seeds` (store IDs) for node-level tasks, with features from RAM
    (`features="memory"`) or streamed from the SSD (`"ssd"`) within `memory_budget`; the
    benchmark baselines `"mmap"` and `"per-row"` behave alike. Defaults follow the config.

    `eval_fanouts`/`eval_batch_size` size the ssd buffers for evaluation loaders made with
    `with_seeds`; `scratch_dir` holds compact blocks (default: a private temporary
    directory, removed by `close`).

    `seed_order="proximity"` draws each epoch's training seeds in runs of `seed_window`
    nearby store IDs (`gnnssd.sampler.proximity_order`) instead of a uniform shuffle.

    `reuse_epochs=K` trains K consecutive epochs on the same samples (seed order and
    neighbour draws of the group's first epoch; groups start at `first_epoch`, the number
    of the loop's first epoch); in ssd mode the group's other epochs replay its plans and
    compact blocks from disk instead of sampling and repacking again.

    Data parallel: rank `rank` of `world_size` (default: this process's place in the
    initialised torch.distributed process group, else 0 of 1) iterates over its `shard` of
    each epoch's seed order, the same order on every rank; all ranks get the same number of
    mini-batches. `with_seeds` views are not sharded.
    """

    def __init__(self, store: Store, seeds: np.ndarray, *, fanouts: list[int], batch_size: int,
                 features: str = "memory", memory_budget: int | str = _SSD.memory_budget,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                 device: str | torch.device = "auto", block_budget: int | str = _SSD.block_budget,
                 hot_fraction: float = _SSD.hot_fraction, mega_batch: int = _SSD.mega_batch,
                 queue_depth: int = _SSD.queue_depth, io_backend: str = _SSD.io_backend,
                 eval_fanouts: list[int] | None = None, eval_batch_size: int = SamplerConfig.eval_batch_size,
                 verify_checksums: bool = _SSD.verify_checksums, scratch_dir: str | Path | None = None,
                 rank: int | None = None, world_size: int | None = None,
                 seed_order: str = SamplerConfig.seed_order, seed_window: int = SamplerConfig.seed_window,
                 reuse_epochs: int = SamplerConfig.reuse_epochs, first_epoch: int = 0):
        if features not in FEATURES:
            raise ValueError(f"features: {features!r}; expected one of {FEATURES}")
        if seed_order not in SEED_ORDERS:
            raise ValueError(f"seed_order: {seed_order!r}; expected one of {SEED_ORDERS}")
        if seed_window < 1:
            raise ValueError(f"seed_window: {seed_window}; expected a positive integer")
        if batch_size < 1:
            raise ValueError(f"batch_size: {batch_size}; expected a positive integer")
        if reuse_epochs < 1:
            raise ValueError(f"reuse_epochs: {reuse_epochs}; expected a positive integer")
        rank, world_size = _ranks(rank, world_size)
        seed = run_seed(seed)  # any integer; DGL and NumPy take a bounded range
        self.device = device if isinstance(device, torch.device) else select_device(device)
        self.timer = StageTimer()
        self._scratch = None
        if scratch_dir is None and features == "ssd":
            scratch_dir = self._scratch = Path(tempfile.mkdtemp(prefix="gnnssd-scratch-"))
        ssd = SSDConfig(memory_budget=memory_budget, mega_batch=mega_batch, hot_fraction=hot_fraction,
                        block_budget=block_budget, queue_depth=queue_depth, io_backend=io_backend,
                          verify_checksums=verify_checksums)
        sampling = SamplerConfig(fanouts=list(fanouts), batch_size=batch_size, eval_fanouts=eval_fanouts,
                                 eval_batch_size=eval_batch_size)
        try:
            self._backend = _open_backend(features, store, ssd, sampling, seed, self.device, self.timer,
                                          None if scratch_dir is None else Path(scratch_dir))
        except BaseException:
            self._remove_scratch()
            raise
        self._owner = True
        self._configure(store, features, seeds, list(fanouts), batch_size, shuffle, seed, drop_last)
        self.rank, self.world_size = rank, world_size
        self.window = seed_window if seed_order == "proximity" else 0
        self.reuse_epochs, self.first_epoch = reuse_epochs, first_epoch

    def _configure(self, store: Store, features: str, seeds: np.ndarray, fanouts: list[int], batch_size: int,
                   shuffle: bool, seed: int, drop_last: bool) -> None:
        self.store, self.features = store, features
        self.seeds = np.array(seeds, dtype=np.int64)  # a copy: store arrays are read-only
        self.fanouts, self.batch_size = fanouts, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size = 0, 1
        self.window = 0
        self.reuse_epochs, self.first_epoch = 1, 0
        self.epoch = 0
        self._io_seen: dict[str, int] = {}

    def with_seeds(self, seeds: np.ndarray, *, fanouts: list[int] | None = None, batch_size: int | None = None,
                   shuffle: bool = False, drop_last: bool = False) -> NodeLoader:
        """A loader over other seeds (e.g. a validation split) sharing this one's features,
        hot cache and buffers; closing it releases nothing, closing this one releases all."""
        view = object.__new__(NodeLoader)
        view.device, view.timer, view._backend = self.device, self.timer, self._backend
        view._scratch, view._owner = None, False
        view._configure(self.store, self.features, seeds, list(fanouts or self.fanouts),
                        batch_size or self.batch_size, shuffle, self.seed, drop_last)
        return view

    @property
    def backend(self) -> FeatureBackend:
        """The feature backend this loader drives (EdgeLoader drives it with edge batches)."""
        return self._backend

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration draws its shuffle and neighbours for."""
        self.epoch = epoch

    @property
    def sample_epoch(self) -> int:
        """The epoch whose samples this one trains on: the first of its group of
        `reuse_epochs` epochs, groups counted from `first_epoch` (an epoch before that is
        its own)."""
        if self.epoch < self.first_epoch:
            return self.epoch
        return self.epoch - (self.epoch - self.first_epoch) % self.reuse_epochs

    def seed_batches(self) -> list[np.ndarray]:
        """This epoch's seed batches (this rank's share), in order (the same in every mode)."""
        return seed_batches(self.seeds, self.batch_size, self.shuffle, self.seed, self.sample_epoch,
                            self.drop_last, self.rank, self.world_size, self.window)

    def __iter__(self) -> Iterator[MiniBatch]:
        return self._backend.minibatches(self.seed_batches(), self.fanouts, self.sample_epoch,
                                         reuse_epochs=self.reuse_epochs)

    def __len__(self) -> int:
        full, rest = divmod(-(-len(self.seeds) // self.world_size), self.batch_size)
        return full + (0 if self.drop_last or rest == 0 else 1)

    def io_stats(self) -> dict[str, int]:
        """Bytes read and written and requests sent to the disk since the previous call
        (the first call includes the set-up: the feature load or the hot cache)."""
        now = self._backend.io_stats()
        delta = {k: v - self._io_seen.get(k, 0) for k, v in now.items()}
        self._io_seen = now
        return delta

    def stage_times(self) -> dict[str, float]:
        """Seconds per stage (sample/plan/read/gather/transfer/wait...) since the previous
        call; background stages overlap the caller's."""
        return self.timer.take()

    def close(self) -> None:
        """Release files, buffers, I/O threads and the private scratch directory."""
        if self._owner:
            self._owner = False
            try:
                self._backend.close()
            finally:
                self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> NodeLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size) as given, or this process's in the initialised process group."""
    from .distributed import current

    ranks = current()
    rank = ranks.rank if rank is None else rank
    world_size = ranks.world_size if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank}, world_size {world_size}: expected 0 <= rank < world_size")
    return rank, world_size


def _open_backend(features: str, store: Store, ssd: SSDConfig, sampling: SamplerConfig, seed: int,
                  device: torch.device, timer: StageTimer, scratch_dir: Path | None) -> FeatureBackend:
    if features == "memory":
        return MemoryLoader(store, device, timer, seed)
    if features == "ssd":
        from .ssd_loader import SSDLoader

        return SSDLoader(store, ssd, sampling, seed, device, timer, scratch_dir / "blocks")
    from .baselines import MmapLoader, PerRowLoader

    if features == "mmap":
        return MmapLoader(store, device, timer, seed)
    return PerRowLoader(store, device, timer, seed, parse_bytes(ssd.memory_budget))

