"""What every feature backend shares: the mini-batch it yields, its I/O counters, the
labels, the store's topology in RAM (and as a DGL graph, the tests' reference), and the
loader protocol.

The loader protocol every feature backend follows (memory, ssd, the baselines), which
`NodeLoader` and `EdgeLoader` drive: `minibatches(batches, fanouts, epoch, exclude=None)`
yields a `MiniBatch` per given array of seed nodes (sampled without the edges `exclude`
lists, if any), `io_stats()` counts what reached the disk, `close()` releases it all.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Hashable, Iterator, TypeVar

import dgl
import numpy as np
import psutil
import torch

from gnnssd.compiler import CSCBlock, TypedCSCBlock
from gnnssd.core import ConfigError, dgl_has_cuda, format_bytes
from gnnssd.storage_format import Store, check_indptr_monotone, check_range, mapped_take

from .form import block_form


@dataclass
class MiniBatch:
    """One mini-batch, all on the loader's device: `x` holds the float32 features of
    `input_nodes`, `y` the labels of `output_nodes` (-1: unlabelled, see `labelled`).
    From a NodeLoader or EdgeLoader the node IDs (input_nodes, output_nodes, the blocks'
    dgl.NID) are the dataset's own, as `store.train_idx` gives them; a backend makes its
    mini-batches in store IDs and the loader converts them (FeatureSource.with_original_ids).
    On a heterogeneous store input_nodes, output_nodes and x are dicts by
    node type (x: the types with features) with IDs within each type, as DGL's DataLoader
    gives them for a heterograph; y stays one tensor (the seeds' labels, in the order of
    output_nodes of their one type; an edge batch's ends, of two types, in store ID
    order). As DGL's DataLoader does, `blocks[0].srcdata["feat"]` is `x` and
    `blocks[-1].dstdata["label"]` is `y`, and a mini-batch unpacks as DGL's tuple:
    `for input_nodes, output_nodes, blocks in loader`. GraphBolt's names read the same
    fields: `node_features["feat"]` is `x`, `labels` is `y`, `seed_nodes` is
    `output_nodes` (per type on a heterogeneous store, keyed as GraphBolt keys them).
    `typed` says which of the two forms it has, as the one boundary chose it for the store
    (gnnssd.loading.form.typed_form): nothing here guesses it from the values."""

    input_nodes: torch.Tensor | dict[str, torch.Tensor]
    output_nodes: torch.Tensor | dict[str, torch.Tensor]
    blocks: list[dgl.DGLGraph]
    x: torch.Tensor | dict[str, torch.Tensor]
    y: torch.Tensor
    #: The blocks as CSC tensors on y's device, made on first use (see `csc_blocks`).
    csc: list[CSCBlock] | list[TypedCSCBlock] | None = field(default=None, kw_only=True)
    #: The typed form (dicts by node type, heterogeneous blocks; see form.typed_form), else plain.
    typed: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        if not self.blocks or self.blocks[0].device != self.y.device:  # CPU blocks of a GPU batch
            return
        # an x gathered on the GPU beside CPU blocks (the device gather) stays out of them
        # (csc_blocks carry the graph there)
        if self.typed:  # per type (DGL's dict assignment to a block's dstdata is off)
            for name, x in self.x.items():
                if x.device == self.y.device:
                    self.blocks[0].srcnodes[name].data["feat"] = x
            seeded = [name for name, ids in self.output_nodes.items() if len(ids)]
            if len(seeded) == 1:  # seeds of several types (an edge batch's ends): y has no one type
                self.blocks[-1].dstnodes[seeded[0]].data["label"] = self.y
        else:
            if self.x.device == self.y.device:
                self.blocks[0].srcdata["feat"] = self.x
            self.blocks[-1].dstdata["label"] = self.y

    def __iter__(self) -> Iterator[Any]:
        """DGL's (input_nodes, output_nodes, blocks)."""
        return iter((self.input_nodes, self.output_nodes, self.blocks))

    # GraphBolt's names (dgl.graphbolt.MiniBatch), read-only, so a GraphBolt loop body runs
    # unchanged: `data.node_features["feat"]`, `data.labels`, `data.seed_nodes`.

    @property
    def node_features(self) -> dict[str, torch.Tensor] | dict[tuple[str, str], torch.Tensor]:
        """GraphBolt's name for `x`: the input nodes' features by feature name, {"feat": x};
        on a heterogeneous store by (node type, "feat") for each featured type, as GraphBolt
        keys them."""
        if self.typed:
            return {(node_type, "feat"): x for node_type, x in self.x.items()}
        return {"feat": self.x}

    @property
    def labels(self) -> torch.Tensor | dict[str, torch.Tensor]:
        """GraphBolt's name for `y`, the seeds' labels; on a heterogeneous store by the
        seeds' node type, {type: y}, as GraphBolt gives them."""
        if not self.typed:
            return self.y
        seeded = [name for name, ids in self.output_nodes.items() if len(ids)]
        if len(seeded) != 1:
            raise ValueError(f"labels: this mini-batch's seeds are of node types {seeded}, and its y (the labels "
                             "of all of them in store ID order) has no one type; use y")
        return {seeded[0]: self.y}

    @property
    def seed_nodes(self) -> torch.Tensor | dict[str, torch.Tensor]:
        """GraphBolt's name for `output_nodes`, the seeds (by node type on a
        heterogeneous store)."""
        return self.output_nodes

    @property
    def labelled(self) -> torch.Tensor:
        """Which output nodes have a label (y >= 0): a loss must skip the others."""
        return self.y >= 0

    @property
    def csc_blocks(self) -> list[CSCBlock] | list[TypedCSCBlock]:
        """The blocks as CSCBlocks (TypedCSCBlocks on a heterogeneous store) on this
        mini-batch's device: what compiled layers run on where DGL cannot hold a graph (a
        GPU with PyPI's CPU-only DGL)."""
        if self.csc is None:
            self.csc = [block.to(self.y.device) for block in self._host_csc()]
        return self.csc

    def _host_csc(self) -> list[CSCBlock] | list[TypedCSCBlock]:
        """The blocks in CSC form on the host: `csc` once made, else built from the DGL blocks."""
        if self.csc is not None:
            return self.csc
        return [block_form(self.typed).csc_block.from_dgl(block) for block in self.blocks]

    @property
    def model_blocks(self) -> list[dgl.DGLGraph] | list[CSCBlock] | list[TypedCSCBlock]:
        """The blocks a model runs on, on this mini-batch's device: DGL's where DGL holds
        them there (the CPU, or DGL's CUDA build), else `csc_blocks`."""
        if not self.blocks or self.blocks[0].device == self.y.device:
            return self.blocks
        return self.csc_blocks

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MiniBatch:
        """This mini-batch with every tensor and block on `device` (itself if there already).
        To a GPU: copied on the copy stream (gnnssd.loading.device), float16 rows widened
        there; DGL's blocks go along where DGL has CUDA, else they stay on the CPU and
        `csc_blocks` carry the graph."""
        target = torch.device(device)
        if self.y.device == target:
            return self
        if target.type != "cuda":
            moved = {f.name: _to(getattr(self, f.name), target, non_blocking) for f in fields(self)}
            return type(self)(**moved)
        from .device import DeviceCopy

        host = {f.name: getattr(self, f.name) for f in fields(self)}
        host["csc"] = self._host_csc()
        blocks = host.pop("blocks")
        with DeviceCopy(target) as copy:
            moved = {name: value if value is None or isinstance(value, (tuple, bool)) else copy.move(value, widen=name == "x")
                     for name, value in host.items()}
        return type(self)(**moved, blocks=[b.to(target) for b in blocks] if dgl_has_cuda() else blocks)


def _to(value: Any, device: torch.device | str, non_blocking: bool) -> Any:
    if value is None or isinstance(value, bool):  # (typed: no tensor)
        return value
    if isinstance(value, list):
        return [b.to(device) for b in value]
    if isinstance(value, dict):
        return {k: v.to(device, non_blocking=non_blocking) for k, v in value.items()}
    return value.to(device, non_blocking=non_blocking)


T = TypeVar("T")
#: Per Store object, what its loaders share (see `store_shared`): key -> value, or a weak
#: reference to it.
_SHARED: weakref.WeakKeyDictionary[Store, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def store_shared(store: Store, key: Hashable, make: Callable[[], T], weak: bool = True) -> T:
    """What `make()` gives for `store` and `key`, made once and shared by the loaders of
    this Store object: what a loader's open computes that depends on the store (and `key`)
    only, not on which loader asks (memory mode's features and topology, the hot ranking,
    the x arrays' sizing samples), so a loader opened per evaluation beside the training
    one costs nothing. `weak`: held only while something else holds it (a large value's
    memory goes with its last loader); else as long as the store object lives. Values
    are read-only to their holders."""
    found = store_held(store, key)
    if found is not None:
        return found
    value = make()  # outside the lock: two threads may both make it, the later one is kept
    with _SHARED_LOCK:
        _SHARED.setdefault(store, {})[key] = weakref.ref(value) if weak else value
    return value


def store_held(store: Store, key: Hashable) -> Any:
    """The value `store_shared` holds for `store` and `key`, or None."""
    with _SHARED_LOCK:
        held = _SHARED.get(store, {}).get(key)
    return held() if isinstance(held, weakref.ref) else held


class IOCounters:
    """Bytes and requests a loader sent to the disk since it was opened, and `useful_bytes`:
    the bytes of the cold rows its mini-batches needed (each mini-batch's distinct input rows
    outside its cache), so bytes_read / useful_bytes is the read amplification. The ssd
    loader's read and repack threads add to them at once, hence the lock. `part` names where
    bytes read went (e.g. the ssd loader's "packing", "packed", "extents"): `parts()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_read = self.bytes_written = self.requests = self.useful_bytes = 0
        self._parts: dict[str, int] = {}

    def add(self, bytes_read: int = 0, bytes_written: int = 0, requests: int = 0,
            useful_bytes: int = 0, part: str | None = None) -> None:
        with self._lock:
            self.bytes_read += bytes_read
            self.bytes_written += bytes_written
            self.requests += requests
            self.useful_bytes += useful_bytes
            if part is not None:
                self._parts[part] = self._parts.get(part, 0) + bytes_read

    def parts(self) -> dict[str, int]:
        """Bytes read by part, as `{part}_read_bytes`."""
        with self._lock:
            return {f"{part}_read_bytes": n for part, n in self._parts.items()}

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {"bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                    "requests": self.requests, "useful_bytes": self.useful_bytes}


def check_memory(store: Store, features: str, needs: dict[str, int]) -> None:
    """Refuse at once, naming the parts and the way out, a mode whose arrays do not fit
    in the memory available now (rather than being killed by the kernel half-way)."""
    total, available = sum(needs.values()), psutil.virtual_memory().available
    if total <= available:
        return
    parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in needs.items() if n)  # (0: this store has none)
    suggest = format_bytes(max(min(available // 2, store.feature_bytes // 8), 64 << 20))
    raise ConfigError(f"features: {features} needs about {format_bytes(total)} of RAM for the store "
                      f"{store.path} ({parts}); {format_bytes(available)} is available. Use "
                      f"`features: ssd` with an `ssd.memory_budget` (e.g. {suggest}) to stream the "
                      "features from the SSD")


def store_topology(store: Store) -> tuple[np.ndarray, np.ndarray]:
    """The store's CSC (indptr, indices) as int64 arrays in RAM, checked first: indptr
    monotone and indices in range (open checks only their ends; this copies them anyway),
    so neither gnnssd's sampler nor DGL meets a bad one: DGL aborts the process on a
    decreasing indptr."""
    check_indptr_monotone(store.path / "indptr.npy", store.indptr)
    check_range(store.path / "indices.npy", store.indices, 0, store.num_nodes, "a node ID")
    return np.array(store.indptr, dtype=np.int64), np.array(store.indices, dtype=np.int64)


def store_graph(store: Store) -> dgl.DGLGraph:
    """The store's topology as a DGL graph, built from its checked CSC arrays
    (store_topology), in store IDs: the reference tests sample DGL's way on.

    The graph uses int64 IDs: with int32 IDs DGL 2.1's g-SpMM backward crashes
    (segfault) on blocks sampled from a CSC-only graph."""
    indptr, indices = store_topology(store)
    empty = torch.empty(0, dtype=torch.int64)
    return dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), empty)), num_nodes=store.num_nodes)


class Labels:
    """The nodes' labels (store IDs, -1: unlabelled), read per mini-batch from the
    memory-mapped labels.npy (storage_format.mapped_take: a mini-batch's seeds touch a page
    each at most, released after the lookup): nothing node-sized is held (a copy took 2
    bytes a node even as int16: 0.2 GiB at 111M nodes)."""

    def __init__(self, store: Store):
        self.store = store

    def __getitem__(self, nodes: torch.Tensor) -> torch.Tensor:
        """The labels of `nodes` as the int64 tensor losses take."""
        return torch.from_numpy(mapped_take(self.store.labels, nodes.numpy()).astype(np.int64))


def load_features(store: Store) -> torch.Tensor:
    """The whole feature matrix in RAM as float32 (memory mode only), every page checked
    against the store's page checksums as it loads."""
    return torch.from_numpy(store.as_float32(store.read_features()))


