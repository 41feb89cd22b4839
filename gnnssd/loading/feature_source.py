"""`FeatureSource`: a store's features opened once, for every loader that iterates over them.

GraphBolt keeps its feature store apart from its item sampler and data loader; so does
gnnssd: a FeatureSource owns the feature backend (memory, ssd, mmap, per-row: the protocol
in memory_loader), its scratch directory, stage timer and disk counters, and any number of
cheap `NodeLoader`/`EdgeLoader` iterators share it (training, validation and test loaders
over one hot cache and one pair of buffers). The ssd backend lets one iteration at a time
hold its buffers and re-plans an interrupted one (see SSDLoader.minibatches), so iterators
may interleave freely.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Protocol

import dgl
import numpy as np
import torch

from gnnssd.compiler import CSCBlock
from gnnssd.core import SamplerConfig, SSDConfig, StageTimer, bound_freed_memory, check_count, run_seed, select_device
from gnnssd.sampler import Fanouts, sampling_method
from gnnssd.storage_format import Store, mapped_take

from .backends.baselines import MmapLoader, PerRowLoader
from .backends.device import DeviceLoader
from .backends.memory import MemoryLoader
from .backends.ssd import SSDLoader
from .form import BlockForm, block_form, by_type
from .types import MiniBatch


class FeatureBackend(Protocol):
    """What the loaders drive: a mini-batch per seed batch, disk counters, release.

    What a backend can do is declared on its class, for the code above it to ask:
    `OUT_OF_CORE`: the features stay on the disk and are read while training (its io_stats
    count the reads; layer-wise inference keeps its layers in files too);
    `MEMORY_BUDGET`: it holds `ssd.memory_budget` bytes in RAM (checked against the memory
    available);
    `SCRATCH`: it writes under a scratch directory (compact blocks, an epoch kept for reuse);
    `EDGE_BATCHES`: it serves EdgeLoader (sampling without each batch's positive edges)."""

    OUT_OF_CORE: bool
    MEMORY_BUDGET: bool
    SCRATCH: bool
    EDGE_BATCHES: bool
    timer: StageTimer

    def minibatches(self, batches: list[np.ndarray], fanouts: Fanouts | list[Any], epoch: int = 0,
                    exclude: list[np.ndarray] | None = None, reuse_epochs: int = 1) -> Iterator[MiniBatch]:
        ...

    def io_stats(self) -> dict[str, int]:
        ...

    def close(self) -> None:
        ...


#: `features=` name -> backend class; each opens with
#: `cls.open(store, ssd, sampling, seed, device, timer, scratch_dir)`.
BACKENDS: dict[str, type] = {"memory": MemoryLoader, "ssd": SSDLoader, "mmap": MmapLoader, "per-row": PerRowLoader,
                             "device": DeviceLoader}


def backend_class(features: str) -> type:
    """The backend class `features` names (its flags say what it can do); a ValueError
    naming the choices for any other name."""
    if features not in BACKENDS:
        raise ValueError(f"features: {features!r}; expected one of {tuple(BACKENDS)}")
    return BACKENDS[features]


_SSD_KEYS = {f.name for f in dataclasses.fields(SSDConfig)}


def drawn_seed(seed: int | None) -> int:
    """`seed` as a run seed (any integer; DGL and NumPy take a bounded range), or one drawn
    from torch's global generator when None: as DGL's DataLoader, `torch.manual_seed`
    decides a loader's shuffles and neighbour draws unless it is given its own seed."""
    if seed is None:
        seed = int(torch.randint(0, 1 << 62, ()).item())
    return run_seed(seed)


def as_store(store: Store | str | Path) -> Store:
    """A Store, opened from its path when given one."""
    if isinstance(store, (str, Path)):
        return Store.open(store)
    if not isinstance(store, Store):
        raise TypeError(f"store: expected a gnnssd.Store or the path of one, got {type(store).__name__}")
    return store


class FeatureSource:
    """The features of `store` through the backend `features` names, opened once.

    `ssd` (an SSDConfig, whole) bounds the ssd backend's memory; `sampling` sizes its
    buffers for the training and evaluation fanouts and batch sizes the loaders will ask
    for. `seed` seeds the neighbour draws (default: drawn from torch's global generator, so
    `torch.manual_seed` governs it); `scratch_dir` holds compact blocks (default: a
    private temporary directory, removed by `close`, or when the source is garbage
    collected or the interpreter exits if `close` was forgotten). A closed source refuses
    to be used (RuntimeError).
    """

    def __init__(self, store: Store | str | Path, features: str = "memory", ssd: SSDConfig | None = None,
                 sampling: SamplerConfig | None = None, *, seed: int | None = None, device: str | torch.device = "auto",
                 scratch_dir: str | Path | None = None):
        backend = backend_class(features)
        bound_freed_memory()  # a mini-batch's arrays: mapped, not kept in the heaps
        self.store = as_store(store)
        self.features = features
        self.ssd = ssd or SSDConfig()
        self.sampling = sampling or SamplerConfig()
        self.seed = drawn_seed(seed)
        self.device = device if isinstance(device, torch.device) else select_device(device)
        self.timer = StageTimer()
        self._perms: dict[torch.device, torch.Tensor] = {}
        self._closed = False
        self._iterating: dict[int, int] = {}  # thread -> iterations of this source it has running
        self._iterating_lock = threading.Lock()
        scratch = self._scratch = None  # the private scratch directory, if any
        if scratch_dir is None and backend.SCRATCH:
            scratch_dir = scratch = self._scratch = private_scratch()
        try:
            self._backend: FeatureBackend = backend.open(
                self.store, self.ssd, self.sampling, self.seed, self.device, self.timer,
                None if scratch_dir is None else Path(scratch_dir))
        except BaseException:
            _release(None, scratch)
            raise
        # what close() does, also done when the source is collected or at exit without it
        self._release = weakref.finalize(self, _release, self._backend, scratch)

    @contextmanager
    def iteration(self) -> Iterator[None]:
        """One iteration of a loader over this source, in the calling thread. Loaders of one
        source may interleave in one thread (evaluation in the middle of an epoch); an
        iteration while another thread has one running is refused by name (the backend's
        buffers, plans and I/O threads serve one consumer)."""
        me = threading.get_ident()
        with self._iterating_lock:
            if any(thread != me for thread in self._iterating):
                raise RuntimeError(
                    f"this FeatureSource ({self.features} features of {self.store.path}) is being iterated "
                    "in another thread: loaders of one source may interleave in one thread, not run in two "
                    "at once; give each thread its own loader over its own source (e.g. NodeLoader(store, ...))")
            self._iterating[me] = self._iterating.get(me, 0) + 1
        try:
            yield
        finally:
            with self._iterating_lock:
                self._iterating[me] -= 1
                if not self._iterating[me]:
                    del self._iterating[me]

    @property
    def backend(self) -> FeatureBackend:
        """The feature backend (memory, ssd, ...); refused once the source is closed."""
        if self._closed:
            raise RuntimeError(f"this FeatureSource ({self.features} features of {self.store.path}) "
                               "is closed; open a new one")
        return self._backend

    @classmethod
    def from_options(cls, store: Store | str | Path, *, features: str = "memory", seed: int | None = None,
                     device: str | torch.device = "auto", scratch_dir: str | Path | None = None,
                     fanouts: Fanouts | list[Any] | None = None, batch_size: int | None = None,
                     eval_fanouts: Fanouts | list[Any] | None = None,
                     eval_batch_size: int = SamplerConfig.eval_batch_size,
                     method: str = SamplerConfig.method, **ssd: Any) -> FeatureSource:
        """A source from NodeLoader's keyword options: SSDConfig's fields by name
        (memory_budget, hot_fraction, ...), the sampling the buffers are sized for and
        its `method` (uniform or labor, or GraphBolt's and DGL's names of them, any case:
        gnnssd.sampler.sampling_method; every loader over the source samples so)."""
        method = sampling_method(method)
        unknown = sorted(set(ssd) - _SSD_KEYS)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; expected the loader's options or "
                            f"SSDConfig's fields {sorted(_SSD_KEYS)}")
        sampling = SamplerConfig(fanouts=fanouts or SamplerConfig().fanouts,
                                 batch_size=batch_size or SamplerConfig.batch_size,
                                 eval_fanouts=eval_fanouts, eval_batch_size=eval_batch_size, method=method)
        return cls(store, features, SSDConfig(**ssd), sampling, seed=seed, device=device, scratch_dir=scratch_dir)

    def _original(self, store_ids: torch.Tensor) -> torch.Tensor:
        """perm[store_ids] on their device: on the CPU looked up in the memory-mapped perm.npy
        window by window, its pages released (no node-sized copy, and not its whole mapping
        in the RSS: 0.9 GB at 10^8 nodes; storage_format.mapped_take), elsewhere from a copy
        kept there."""
        if store_ids.device.type == "cpu":
            return torch.from_numpy(mapped_take(self.store.perm, store_ids.numpy()))
        if store_ids.device not in self._perms:
            self._perms[store_ids.device] = torch.from_numpy(np.array(self.store.perm, dtype=np.int64)).to(store_ids.device)
        return self._perms[store_ids.device][store_ids]

    def _original_of_type(self, node_type: str, ids: torch.Tensor) -> torch.Tensor:
        """Per-type IDs of `node_type` in the dataset's: a node order keeps each type's
        range, so the type's offset goes in and the same offset comes out (a homogeneous
        store's one type, and a typed store's first, start at 0)."""
        offset = int(self.store.schema.offsets[self.store.schema.type_id(node_type)])
        return self._original(ids + offset) - offset if offset else self._original(ids)

    def store_ids(self, original_ids: np.ndarray) -> np.ndarray:
        """Store rows of the dataset's node IDs: the one conversion in, for the loaders
        (inv.npy looked up as perm.npy is in `_original`)."""
        return mapped_take(self.store.inv, original_ids)

    @cached_property
    def renumbered(self) -> bool:
        """Store IDs differ from the dataset's (a node order other than the original)."""
        return self.store.manifest["order"] != "original"  # the writer's perm is the identity then

    def with_original_ids(self, batch: MiniBatch) -> MiniBatch:
        """`batch` (from a backend, in store IDs) with input_nodes, output_nodes and its
        blocks' node IDs (DGL's `dgl.NID`) in the dataset's IDs: the one conversion out."""
        if not self.renumbered:
            return batch
        original = _PrefixLookup(self, batch.input_nodes)
        for block in batch.blocks:  # a homogeneous store's blocks: the one node type "_N"
            for node_type, data in _node_frames(block):
                if dgl.NID in data:
                    data[dgl.NID] = original(node_type, data[dgl.NID])
        form = block_form(batch.typed)
        return dataclasses.replace(batch, input_nodes=original.of(batch.input_nodes, form),
                                   output_nodes=original.of(batch.output_nodes, form))

    @property
    def out_of_core(self) -> bool:
        """Features are read from the disk while training (ssd, mmap, per-row)."""
        return self._backend.OUT_OF_CORE

    def io_stats(self) -> dict[str, int]:
        """Bytes read and written and requests sent to the disk since opening."""
        return self.backend.io_stats()

    def close(self) -> None:
        """Release files, buffers, I/O threads and the private scratch directory."""
        self._closed = True
        self._release()  # once: a finalizer runs its function at most once

    def __enter__(self) -> FeatureSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PrefixLookup:
    """A mini-batch's IDs in the dataset's, each input node looked up once: every block's
    node IDs, and the output nodes, begin the input nodes (a sampled block's nodes are a
    prefix of the next layer's), so they are slices of the input nodes' lookup (perm.npy
    was looked up for ~2.8x the input nodes). IDs that do not begin them are looked up."""

    def __init__(self, source: FeatureSource, input_nodes: torch.Tensor | dict[str, torch.Tensor]):
        self.source = source
        self.inputs = by_type(input_nodes, None)
        self.converted: dict[str | None, torch.Tensor] = {}

    def __call__(self, node_type: str, ids: torch.Tensor) -> torch.Tensor:
        key = node_type if node_type in self.inputs else None
        full = self.inputs.get(key)
        if full is None or len(ids) > len(full) or not _begins(ids, full):
            return self.source._original_of_type(node_type, ids)
        if key not in self.converted:
            self.converted[key] = self.source._original_of_type(node_type, full)
        return self.converted[key][: len(ids)]

    def of(self, ids: torch.Tensor | dict[str, torch.Tensor],
           form: BlockForm) -> torch.Tensor | dict[str, torch.Tensor]:
        """`ids` (global store IDs, or a typed store's per-type IDs by type) in the dataset's,
        in `form` (the mini-batch's)."""
        given = by_type(ids, self.source.store.schema.type_names[0])
        return form.nodes({name: self(name, v) for name, v in given.items()})


def _node_frames(block: dgl.DGLGraph | CSCBlock) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """(node type, its frame) of each source and destination node type of a block: a DGL
    block's, or a CSCBlock's (features: device), whose one type is "_N"."""
    if isinstance(block, CSCBlock):
        return [("_N", block.srcdata), ("_N", block.dstdata)]
    return [(node_type, nodes[node_type].data) for nodes, types in ((block.srcnodes, block.srctypes),
                                                                    (block.dstnodes, block.dsttypes))
            for node_type in types]


def _begins(ids: torch.Tensor, full: torch.Tensor) -> bool:
    """Whether `ids` are the first len(ids) of `full` (a view of its start, or equal to it)."""
    if ids.device != full.device or ids.dtype != full.dtype:
        return False
    if ids.data_ptr() == full.data_ptr() and ids.is_contiguous() and full.is_contiguous():
        return True
    return torch.equal(ids, full[: len(ids)])


def _release(backend: FeatureBackend | None, scratch: Path | None) -> None:
    """Close `backend`, then remove the private `scratch` directory (if any)."""
    try:
        if backend is not None:
            backend.close()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


SCRATCH_PREFIX = "gnnssd-scratch-"
#: A dead process's scratch is removed once untouched this long (a live loader writes to its
#: scratch all the time; the age guards a temp directory shared across PID namespaces).
STALE_SCRATCH_S = 600


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def private_scratch() -> Path:
    """A fresh scratch directory in the temp directory, named by this process's pid; those
    a killed process left (its pid gone, untouched for STALE_SCRATCH_S, this user's own
    directory, no link) are removed first: no killed run's blocks pile up there."""
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = old.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        try:
            info = old.lstat()
        except OSError:
            continue
        if (pid.isdigit() and not _alive(int(pid)) and stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
                and time.time() - info.st_mtime > STALE_SCRATCH_S):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))


_PER_PROCESS = ("a {name} cannot be {how}: it holds this process's open files, buffers and I/O threads. "
                "A loader is per process: make one in each process from the store's path (as each "
                "data-parallel rank does), and iterate it directly rather than inside "
                "torch.utils.data.DataLoader(num_workers>0), whose workers are other processes")


class SourceLoader:
    """What NodeLoader and EdgeLoader share: iterating over a FeatureSource, their own
    (opened from a Store and closed with them) or shared (closing them releases nothing);
    the epoch; and this loader's own view of the disk counters and stage times.

    Each iteration is an epoch, as with DGL's DataLoader: iterating again draws the next
    epoch's order and neighbours. `set_epoch(e)` makes the next iteration epoch e (data
    parallel ranks agree on it; the same e replays the same batches)."""

    def __init__(self, source: FeatureSource, owns_source: bool):
        source.backend  # refuses a closed source
        self.source, self._owns_source = source, owns_source
        self._closed = False
        self._pid = os.getpid()
        self.epoch = 0
        self._epoch_set = False  # set_epoch named the next iteration's epoch
        self._iterated = False
        self._io_seen: dict[str, int] = {}

    @property
    def store(self) -> Store:
        return self.source.store

    @property
    def device(self) -> torch.device:
        return self.source.device

    @property
    def timer(self) -> StageTimer:
        return self.source.timer

    @property
    def backend(self) -> FeatureBackend:
        """The feature backend this loader drives; refused once the loader (or its
        source) is closed."""
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed; make a new one to iterate again")
        if os.getpid() != self._pid:
            raise RuntimeError(_PER_PROCESS.format(name=type(self).__name__, how=f"used in process {os.getpid()}, "
                                                   f"a fork of the process {self._pid} that made it"))
        return self.source.backend

    def __reduce__(self):
        raise TypeError(_PER_PROCESS.format(name=type(self).__name__, how="pickled"))

    def _check_still_open(self) -> None:
        """Between two mini-batches of an epoch: refuse to go on once this loader or its source
        was closed (memory mode's iterator kept yielding from the closed source, ssd's ended as
        if the epoch were whole)."""
        if self._closed or self.source._closed:
            closed = f"this {type(self).__name__}" if self._closed else "the FeatureSource of this loader"
            raise RuntimeError(f"{closed} was closed during an epoch; the epoch's iterator cannot go on "
                               f"(make a new loader to iterate again)")

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration draws its order, negatives and neighbours for
        (without it, each iteration is the one after the previous): an integer from 0 to
        MAX_COUNT, NumPy's too (np.int64(4) reached DGL's C++ as it was)."""
        self.epoch, self._epoch_set = check_count(epoch, "set_epoch: epoch"), True

    def _start_epoch(self) -> int:
        """The epoch an iteration starting now runs: the one set_epoch named, else the
        previous iteration's plus one (the first: 0)."""
        if not self._epoch_set and self._iterated:
            self.epoch += 1
        self._epoch_set, self._iterated = False, True
        return self.epoch

    def io_stats(self) -> dict[str, int]:
        """Bytes read and written and requests sent to the disk since this loader's
        previous call (the first call includes the set-up: the feature load or the hot
        cache)."""
        now = self.source.io_stats()
        delta = {k: v - self._io_seen.get(k, 0) for k, v in now.items()}
        self._io_seen = now
        return delta

    def stage_times(self) -> dict[str, float]:
        """Seconds per stage (sample/plan/read/gather/transfer/wait...) of the source since
        the previous call; background stages overlap the caller's."""
        return self.timer.take()

    def close(self) -> None:
        """Release the source's files, buffers, I/O threads and private scratch directory
        if this loader opened it; a loader over a shared source releases nothing. The
        loader refuses to iterate afterwards."""
        self._closed = True
        if self._owns_source:
            self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
