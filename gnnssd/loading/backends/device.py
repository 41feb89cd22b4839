"""`features: device`: the whole store on the training device, sampled and gathered there.

GraphBolt's "cuda" mode without DGL's CUDA build (not on the package index): at open, the
features (in the store's dtype: float16 stays float16), the CSC topology and the labels
are streamed onto the loader's device through one small host bounce buffer (host memory
stays within `ssd.memory_budget`; nothing is read whole into RAM), features.bin through
the I/O engine with every page checked against the store's page checksums, the .npy
arrays with their CRC-32 recomputed on the way. Then each mini-batch is sampled on the
device by gnnssd.loading.tensor_sampling (the compiler's CSCBlocks, no host round trip
but a few counts) and its x gathered by one index_select. With `device: cpu` the same
code runs on the CPU, which is how it is tested.

The blocks are CSCBlocks (`mb.blocks` and `mb.model_blocks`): the built-in models and
compiled layers run on them; dgl.nn layers, which take DGL graphs only, are refused.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Iterator

import dgl
import numpy as np
import psutil
import torch

from gnnssd.core import ConfigError, SamplerConfig, SSDConfig, StageTimer, format_bytes
from gnnssd.pipeline import DirectIO
from gnnssd.sampler import Fanouts
from gnnssd.storage_format import Store, StoreError

from ..device import copy_stream
from ..tensor_sampling import TensorSampler
from ..form import plain_form_only
from ..types import IOCounters, MiniBatch

#: Bytes of one read request of the feature stream (many are in flight per bounce buffer).
EXTENT_BYTES = 1 << 20
#: The host bounce buffer's size at most (less when ssd.memory_budget is smaller).
BOUNCE_BYTES = 16 << 20
PAGE = 4096


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of `device`'s memory: the GPU's, or the RAM for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    memory = psutil.virtual_memory()
    return memory.available, memory.total


class DeviceLoader:
    """The store's arrays on `device`, mini-batches sampled and gathered there."""

    #: What this backend can do (gnnssd.loading.feature_source.FeatureBackend): everything
    #: on the device after the load (not out of core), a bounce buffer within the budget
    #: rather than the budget itself, no scratch, node mini-batches only.
    OUT_OF_CORE = False
    MEMORY_BUDGET = False
    SCRATCH = False
    EDGE_BATCHES = False

    def __init__(self, store: Store, ssd: SSDConfig, device: torch.device, timer: StageTimer,
                 seed: int = 0, method: str = SamplerConfig.method):
        plain_form_only(store.schema, ConfigError(
            f"features: device: the store {store.path} is heterogeneous ({', '.join(store.schema.type_names)}); "
            "device sampling takes one node and edge type for now: use features: memory or ssd"))
        self.store, self.device, self.timer, self.seed, self.method = store, device, timer, seed, method
        self.io = IOCounters()
        check_fits(store, ssd, device)
        engine = DirectIO(ssd.queue_depth, ssd.io_backend,
                          {store.features_path: store.page_checksums()} if ssd.verify_checksums else None)
        try:
            bounce = Bounce(engine, _bounce_bytes(ssd.memory_budget), device)
            with timer.stage("load"):
                try:
                    raw = self._stream_features(bounce)
                    self.indptr = self._stream_array("indptr.npy", store.indptr, bounce)
                    self.indices = self._stream_array("indices.npy", store.indices, bounce)
                    self.labels = self._stream_array("labels.npy", store.labels, bounce)
                finally:
                    bounce.finish()
        finally:
            engine.shutdown()
        rows = raw[: store.feature_bytes].view(_torch_dtype(store.feat_dtype)).view(store.feature_rows, store.feat_dim)
        self.features = rows
        self.row_scales = None if store.row_scales is None else torch.from_numpy(store.row_scales).to(device)

    @classmethod
    def open(cls, store: Store, ssd: SSDConfig, sampling: SamplerConfig, seed: int, device: torch.device,
             timer: StageTimer, scratch_dir: Path | None) -> DeviceLoader:
        """The registry's uniform constructor (gnnssd.loading.feature_source.BACKENDS)."""
        return cls(store, ssd, device, timer, seed, sampling.method)

    def _stream_features(self, bounce: Bounce) -> torch.Tensor:
        """features.bin (padded to its pages) on the device as bytes, read by the engine
        (O_DIRECT, each page checked against features.crc32c) through `bounce`."""
        size = int(self.store.manifest["files"]["features.bin"]["size"])
        out = torch.empty(size, dtype=torch.uint8, device=self.device)
        for lo, half, chunk in bounce.chunks(self.store.features_path, size):
            bounce.copy(half, chunk, out[lo:lo + len(chunk)])
        self.io.add(bytes_read=size, requests=-(-size // EXTENT_BYTES))
        return out

    def _stream_array(self, name: str, mapped: np.memmap, bounce: Bounce) -> torch.Tensor:
        """The store's .npy array `name` (`mapped`: the store's mapping of it, for its dtype,
        shape and data offset) on the device, its file read through `bounce` with its CRC-32
        recomputed on the way and checked against the manifest's at the end."""
        path = self.store.path / name
        header, size = int(mapped.offset), path.stat().st_size
        out = torch.empty(size - header, dtype=torch.uint8, device=self.device)
        crc = 0
        for lo, half, chunk in bounce.chunks(path, size):
            crc = zlib.crc32(chunk, crc)  # (the GIL is released: the next chunk's read goes on)
            skip = max(header - lo, 0)  # the chunk's array bytes start after the header
            if skip < len(chunk):
                bounce.copy(half, chunk[skip:], out[lo + skip - header:lo + len(chunk) - header])
        expected = self.store.manifest["files"][name]["crc32"]
        if crc != expected:
            raise StoreError(f"{path}: checksum mismatch while loading it onto {self.device} (crc32 {crc:#010x}, "
                             f"manifest {expected:#010x}); the file is corrupt")
        self.io.add(bytes_read=size)
        return out.view(_torch_dtype(mapped.dtype)).view(mapped.shape)

    def minibatches(self, batches: list[np.ndarray], fanouts: Fanouts | list[Any], epoch: int = 0,
                    exclude: list[np.ndarray] | None = None, reuse_epochs: int = 1) -> Iterator[MiniBatch]:
        """A mini-batch per array of seed nodes, drawn with the ssd mode's randomness: batch
        b of `epoch` is the numba sampler's batch (epoch << 32) + b under the loader's seed."""
        if exclude is not None:
            raise ValueError("features: device serves node mini-batches only (no edge exclusion)")
        sampler = TensorSampler(self.indptr, self.indices, Fanouts.parse(fanouts).dgl(self.store.schema), self.method)
        for b, seeds in enumerate(batches):
            with self.timer.stage("sample"):
                output_nodes = torch.from_numpy(np.asarray(seeds, np.int64)).to(self.device)
                nodes, blocks = sampler.sample(output_nodes, self.seed, (epoch << 32) + b)
                for block in blocks:
                    block.srcdata[dgl.NID] = nodes[: block.num_src]
                    block.dstdata[dgl.NID] = nodes[: block.num_dst]
            with self.timer.stage("gather"):
                x = self._rows(nodes)
                y = self.labels[output_nodes].to(torch.int64)
            yield MiniBatch(nodes, output_nodes, blocks, x, y, csc=blocks)

    def _rows(self, nodes: torch.Tensor) -> torch.Tensor:
        """x of `nodes` as float32, gathered by one index_select (int8 rows dequantized as
        Store.as_float32 does)."""
        raw = self.features.index_select(0, nodes)
        if self.row_scales is None:
            return raw.float()
        scales = self.row_scales.index_select(0, nodes)
        return raw.float() * scales[:, :1] + scales[:, 1:]

    def io_stats(self) -> dict[str, int]:
        return self.io.as_dict()

    def close(self) -> None:
        """Drop the device arrays (the allocator reuses their memory)."""
        self.features = self.indptr = self.indices = self.labels = self.row_scales = None


class Bounce:
    """The host side of the load: two halves of a bounce buffer (pinned when the device is a
    GPU), so that chunk k+1 of a file is read into one half while chunk k is checked and
    copied to the device out of the other. On a GPU the copies are non-blocking on the
    device's copy stream, and a half is read into again only once its last copy is done;
    on the CPU the copy is an ordinary one, while the engine's reads of the next chunk go on."""

    def __init__(self, engine: DirectIO, nbytes: int, device: torch.device):
        self.engine, self.device = engine, device
        self.cuda = device.type == "cuda"
        self.half_bytes = max(nbytes // 2 // PAGE * PAGE, PAGE)
        self.halves = [engine.alloc(self.half_bytes, pinned=self.cuda) for _ in range(2)]
        #: each half's last copy (a CUDA event), waited for before the half is read into again
        self.copies: list[torch.cuda.Event | None] = [None, None]
        self.stream = copy_stream(device) if self.cuda else None

    def chunks(self, path: Path, size: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """(offset, half, bytes) of the file's bytes [0, size), a half's length at a time,
        each read while the previous one is in the caller's hands: the caller uses a chunk
        (`copy`) before asking for the next, which is then read into its half."""
        f = self.engine.open(path)
        pending = None
        try:
            count = -(-size // self.half_bytes)
            pending = self._submit(f, 0, size) if count else None
            for k in range(count):
                handle, chunk = pending
                pending = self._submit(f, k + 1, size) if k + 1 < count else None
                self.engine.wait(handle)
                yield k * self.half_bytes, k % 2, chunk
        finally:
            if pending is not None:  # stopped early or failed: the next read is not waited for
                pending[0].cancel()
            self.engine.close(f)

    def _submit(self, f: Any, k: int, size: int) -> tuple[Any, np.ndarray]:
        """Start reading chunk k into its half, once the half's last copy is done."""
        half, copied = self.halves[k % 2], self.copies[k % 2]
        if copied is not None:
            copied.synchronize()
        lo = k * self.half_bytes
        n = min(self.half_bytes, size - lo)
        whole = -(-n // f.block_size) * f.block_size  # O_DIRECT reads whole blocks (zeros past the end)
        dest = np.arange(0, whole, EXTENT_BYTES, dtype=np.int64)
        return self.engine.submit(f, lo + dest, np.minimum(EXTENT_BYTES, whole - dest), half, dest), half[:n]

    def copy(self, half: int, chunk: np.ndarray, dest: torch.Tensor) -> None:
        """dest = chunk (a view of half `half`): non-blocking on a GPU, its event recorded."""
        if not self.cuda:
            dest.copy_(torch.from_numpy(chunk))
            return
        with torch.cuda.stream(self.stream):
            dest.copy_(torch.from_numpy(chunk), non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.copies[half] = event

    def finish(self) -> None:
        """Wait for the copies in flight (the halves may then be freed) and order the device's
        work after them."""
        for event in self.copies:
            if event is not None:
                event.synchronize()
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _bounce_bytes(memory_budget: int) -> int:
    """The bounce buffer (both halves): at most BOUNCE_BYTES and half the budget, whole pages."""
    return max(min(BOUNCE_BYTES, memory_budget // 2) // PAGE * PAGE, PAGE)


def device_needs(store: Store, device: torch.device) -> dict[str, int]:
    """Bytes the store takes on `device`, by part."""
    needs = {f"features ({store.feat_dtype})": int(store.manifest["files"]["features.bin"]["size"]),
             "topology": store.indptr.nbytes + store.indices.nbytes, "labels": store.labels.nbytes}
    if store.row_scales is not None:
        needs["int8 row scales"] = store.row_scales.nbytes
    if device.type != "cpu" and store.manifest["order"] != "original":
        needs["node order (the dataset's IDs)"] = 8 * store.num_nodes  # FeatureSource._original's copy
    return needs


def check_fits(store: Store, ssd: SSDConfig, device: torch.device) -> None:
    """Refuse, naming the sizes, a store whose arrays do not fit in `device`'s free memory
    less `ssd.device_reserve` of its total."""
    needs = device_needs(store, device)
    free, total = device_memory(device)
    usable = free - int(ssd.device_reserve * total)
    if sum(needs.values()) <= usable:
        return
    parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in needs.items())
    raise ConfigError(f"features: device needs {format_bytes(sum(needs.values()))} on {device} for the store "
                      f"{store.path} ({parts}); {device} has {format_bytes(free)} free of {format_bytes(total)}, "
                      f"less ssd.device_reserve {ssd.device_reserve:g} of it leaves {format_bytes(max(usable, 0))}. "
                      "Use features: ssd (the features streamed from the SSD within ssd.memory_budget), a float16 "
                      "or int8 store (preprocess --dtype), or a smaller ssd.device_reserve")
