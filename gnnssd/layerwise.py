"""Layer-wise inference of every node, out of core.

Each layer is computed for all nodes over all their in-neighbours, in chunks of
destination nodes in store order (DGL's full-graph inference, done without holding the
graph's activations): a chunk's block holds the chunk's nodes first and then their other
in-neighbours, their input rows are read, the model's layer runs, and the chunk's output
rows are appended to the layer's output. In `ssd` mode the inputs are features.bin and
then each layer's page-aligned scratch feature file, read through the io_engine
(O_DIRECT) and written with O_DIRECT; in `memory` mode they are tensors in RAM (the
reference; gnnssd.layerwise_rows reads a layer's input either way). The chunk size
follows the memory budget.

In `ssd` mode a layer whose neighbour input is the mean of its in-neighbours' rows
(GraphSAGE-mean: `model.mean_aggregation(i)`) is computed instead by sequential passes over
its input file (gnnssd.layerwise_mean): gathering in-neighbour rows is one small read per row
on graphs without neighbourhood locality.

The model must expose the per-layer interface of gnnssd.models.BlockGNN:
`num_layers` and `layer(i, block, h)` (layer i on one DGL block, activation included), and
may expose `mean_aggregation(i)`.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import dgl
import numpy as np
import torch
from torch import nn

from gnnssd.sampler import hot_order
from gnnssd.storage_format import Store
from gnnssd.storage_format.manifest import PAGE

from .budget import format_bytes, parse_bytes
from .checkpoint import load_checkpoint
from .config import Config, ConfigError, SSDConfig
from .layerwise_mean import cost_ranges, mean_layer_chunks
from .layerwise_rows import CachedRows, FileRows, Rows, TensorRows
from .memory_loader import load_features
from .models import build_model
from .pipeline import DirectIO, FeatureFile, load_cost_model
from .pipeline.block_writer import BlockWriter
from .rundir import reading
from .storage_format.atomic import atomic_output
from .tasks import trainer_class

log = logging.getLogger("gnnssd.layerwise")

STAGING_BYTES = 8 << 20  # FileRows' staging: half read while the other half is copied
CHUNK_SHARE = 8  # a chunk's input rows take at most 1/CHUNK_SHARE of the budget
# (ssd mode: half the budget caches the most referenced input rows of each layer)


def chunk_bounds(indptr: np.ndarray, row_bytes: int, budget: int) -> list[tuple[int, int]]:
    """Destination ranges [lo, hi) in store order whose nodes plus in-edges, as rows of
    row_bytes, fit budget // CHUNK_SHARE (at least one node each)."""
    limit = max(budget // CHUNK_SHARE // max(row_bytes, 1), 1)
    # a chunk [lo, hi) needs at most (hi - lo) + (indptr[hi] - indptr[lo]) rows
    return cost_ranges(np.arange(len(indptr), dtype=np.int64) + np.asarray(indptr, np.int64), limit)


def chunk_block(indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int) -> tuple[dgl.DGLGraph, np.ndarray]:
    """The block of destinations lo..hi-1 over all their in-neighbours, and its source
    node IDs (the destinations first, as DGL blocks have them)."""
    a, b = int(indptr[lo]), int(indptr[hi])
    nbrs = np.asarray(indices[a:b], np.int64)
    dst_local = np.repeat(np.arange(hi - lo), np.diff(np.asarray(indptr[lo:hi + 1], np.int64)))
    inside = (nbrs >= lo) & (nbrs < hi)
    extra = np.unique(nbrs[~inside])
    src_local = np.where(inside, nbrs - lo, (hi - lo) + np.searchsorted(extra, nbrs))
    block = dgl.create_block((torch.from_numpy(src_local), torch.from_numpy(dst_local)),
                             num_src_nodes=(hi - lo) + len(extra), num_dst_nodes=hi - lo)
    return block, np.concatenate([np.arange(lo, hi, dtype=np.int64), extra])


def layer_chunks(model: nn.Module, i: int, store: Store, source: Rows,
                 bounds: list[tuple[int, int]]) -> Iterator[torch.Tensor]:
    """Layer i's output rows, chunk by chunk in store order."""
    indptr, indices = store.indptr, store.indices
    for lo, hi in bounds:
        block, src = chunk_block(indptr, indices, lo, hi)
        yield model.layer(i, block, source.rows(src))


@torch.no_grad()
def layerwise_memory(model: nn.Module, store: Store, features: torch.Tensor | None = None,
                     layers: int | None = None, budget: int = 256 << 20) -> torch.Tensor:
    """Every node's output of the first `layers` layers (default all), store order, in RAM.
    Without `features` the store's are loaded here, and freed once layer 0 is done."""
    model.eval()
    h = load_features(store) if features is None else features
    del features
    for i in range(layers or model.num_layers):
        bounds = chunk_bounds(store.indptr, h.shape[1] * 4, budget)
        h = _filled(layer_chunks(model, i, store, TensorRows(h), bounds), store.num_nodes)
    return h


def _filled(chunks: Iterator[torch.Tensor], total: int) -> torch.Tensor:
    """The rows of `chunks` (`total` in all) in one tensor, without holding them twice."""
    first = next(chunks)
    out = torch.empty(total, first.shape[1])
    n = 0
    for h in _prepend(first, chunks):
        out[n:n + len(h)] = h
        n += len(h)
    return out


class LayerwiseSSD:
    """Layer-wise inference with features and activations on disk, within `budget`.

    Layer outputs go to `scratch_dir/layer{i}.bin` (rows of `layer_dtype`: float32, or
    float16 where the disk cannot hold float32 ones; offset 0, padded to a page), each read
    back through the io_engine by the next layer and deleted after it.
    """

    def __init__(self, store: Store, scratch_dir: Path, budget: int, queue_depth: int = 128,
                 backend: str = "auto", layer_dtype: np.dtype = np.dtype(np.float32)):
        self.store, self.scratch_dir, self.budget = store, Path(scratch_dir), budget
        self.layer_dtype = np.dtype(layer_dtype)
        # page checksums for features.bin; the layer files are our own
        self.io = DirectIO(queue_depth, backend, checksums={store.features_path: store.page_checksums()})
        self.model = load_cost_model(store.path)
        self.bytes_read = self.bytes_written = 0

    @torch.no_grad()
    def run(self, model: nn.Module, layers: int | None = None) -> tuple[Path, int]:
        """Compute layers 0..layers-1 (default all); returns the last layer's file and width."""
        last = (layers or model.num_layers) - 1
        source, path = self._last_input(model, last)
        out = self.scratch_dir / f"layer{last}.bin"
        try:
            dim = self._write_layer(model, last, source, out)
        finally:
            self._consumed(source, path)
        return out, dim

    @torch.no_grad()
    def store_order_outputs(self, model: nn.Module) -> Iterator[torch.Tensor]:
        """The last layer's rows in store order, chunk by chunk, never written to disk: for a
        consumer that reduces each row (predict's argmax), one layer file less."""
        last = model.num_layers - 1
        source, path = self._last_input(model, last)
        try:
            yield from self._layer_chunks(model, last, source)
        finally:
            self._consumed(source, path)

    def _last_input(self, model: nn.Module, last: int) -> tuple[FileRows, Path]:
        """The input of layer `last`: features.bin, or the file of layer last-1 (the files
        of earlier layers deleted once read)."""
        model.eval()
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        path = self.store.features_path
        source = self._rows(path, self.store.feat_dim, self.store.feat_dtype, self.store.as_float32)
        for i in range(last):
            out = self.scratch_dir / f"layer{i}.bin"
            try:
                dim = self._write_layer(model, i, source, out)
            finally:
                self._consumed(source, path)
            path, source = out, self._rows(out, dim, self.layer_dtype)
        return source, path

    def _consumed(self, source: FileRows, path: Path) -> None:
        """Close a layer's input, count its reads, and delete it if it is a layer file."""
        source.close()
        self.bytes_read += source.bytes_read
        if path != self.store.features_path:
            path.unlink(missing_ok=True)

    def _rows(self, path: Path, dim: int, dtype: np.dtype,
              as_float32: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> FileRows:
        return FileRows(FeatureFile(self.io, path, dim, dtype, self.model, STAGING_BYTES), as_float32)

    def _write_layer(self, model: nn.Module, i: int, source: FileRows, out: Path) -> int:
        chunks = self._layer_chunks(model, i, source)
        first = next(chunks).contiguous()
        row_bytes = first.shape[1] * self.layer_dtype.itemsize
        with BlockWriter([out], row_bytes, self.io.alloc,
                         memory_bytes=min(self.budget // CHUNK_SHARE, 16 << 20)) as writer:
            for h in _prepend(first, chunks):
                raw = np.ascontiguousarray(h.numpy(), self.layer_dtype).view(np.uint8).reshape(-1)
                writer.append(0, raw, np.arange(len(h), dtype=np.int64) * row_bytes)
        self.bytes_written += os.path.getsize(out)
        return first.shape[1]

    def _layer_chunks(self, model: nn.Module, i: int, source: FileRows) -> Iterator[torch.Tensor]:
        """Layer i's output rows in store order: by sequential passes for a mean-aggregation
        layer, else by chunks over gathered in-neighbour rows and a cache of the most
        referenced ones."""
        store = self.store
        if getattr(model, "mean_aggregation", lambda i: False)(i):
            # chunk inputs: own rows, means, their concatenation and the output
            chunk_rows = max(self.budget // CHUNK_SHARE // (source.dim * 4 * 4), 1)
            return mean_layer_chunks(model, i, source, store.indptr, store.indices, self.budget, chunk_rows)
        bounds = chunk_bounds(store.indptr, source.row_bytes, self.budget)
        # the cache: what the budget leaves after chunk inputs (and their float32 copies,
        # model temporaries) and the writer's buffers, at 4 B per row for the slot map
        hot_bytes = max(self.budget // 2 - store.num_nodes * 4, 0)
        hot = hot_order(store.indptr, store.indices, [-1])[:hot_bytes // (source.dim * 4)]
        return layer_chunks(model, i, store, CachedRows(source, hot, store.num_nodes), bounds)

    def original_order(self, layer_file: Path, dim: int) -> Iterator[np.ndarray]:
        """The layer file's rows in original node order, in chunks within the budget."""
        inv = np.asarray(self.store.inv)
        rows = self._rows(layer_file, dim, self.layer_dtype)
        step = max(self.budget // CHUNK_SHARE // (dim * 4), 1)
        try:
            for lo in range(0, self.store.num_nodes, step):
                yield rows.rows(inv[lo:lo + step]).numpy()
        finally:
            rows.close()
            self.bytes_read += rows.bytes_read

    def close(self) -> None:
        self.io.shutdown()


def _prepend(first: torch.Tensor, rest: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    yield first
    yield from rest


# --- the embed and predict --layerwise commands ------------------------------------------

def trained_model(config: Config) -> nn.Module:
    """The config's built-in model with the best weights of its run directory's checkpoint
    (a link run's encoder)."""
    store = Store.open(config.store_path())
    if not store.schema.is_homogeneous:
        raise ConfigError(f"store {config.store}: layer-wise inference (embed, predict --layerwise) "
                          "does not support heterogeneous stores yet; use `gnnssd predict` without "
                          "--layerwise (sampled with sampler.eval_fanouts)")
    task = trainer_class(config.task)
    model = build_model(config.model, store.feat_dim, task.output_dim(config, store))
    checkpoint = load_checkpoint(config.run_path(), store)
    if checkpoint is None:
        raise RuntimeError(f"{config.run_path()}: no checkpoint; train first")
    state = checkpoint["best"]["state"] or checkpoint["model"]
    prefix = task.ENCODER_PREFIX
    state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    model.load_state_dict(state)
    return model


def layerwise_inference(model: nn.Module, store: Store, features: str = "memory", ssd: SSDConfig | None = None,
                        scratch_dir: Path | None = None, layers: int | None = None,
                        layer_dtype: np.dtype = np.dtype(np.float32)) -> Iterator[np.ndarray]:
    """Every node's output of the first `layers` layers of `model` (any module with the
    per-layer interface: see the module docstring and examples/layerwise_user_model.py),
    in the dataset's node order, in chunks: computed in RAM (`features="memory"`) or
    through files of `layer_dtype` in `scratch_dir` (`"ssd"`, within `ssd.memory_budget`)."""
    ssd = ssd or SSDConfig()
    budget = parse_bytes(ssd.memory_budget)
    if features == "memory":
        h = layerwise_memory(model, store, layers=layers, budget=budget)
        yield h[torch.from_numpy(np.array(store.inv, np.int64))].numpy()
        return
    if scratch_dir is None:
        raise ValueError("layer-wise inference with features ssd needs a scratch_dir for its layer files")
    runner = _runner(store, ssd, scratch_dir, layer_dtype)
    try:
        path, dim = runner.run(model, layers)
        yield from runner.original_order(path, dim)
        path.unlink()
    finally:
        runner.close()


def _runner(store: Store, ssd: SSDConfig, scratch_dir: Path, layer_dtype: np.dtype) -> LayerwiseSSD:
    return LayerwiseSSD(store, Path(scratch_dir) / "layerwise", parse_bytes(ssd.memory_budget), ssd.queue_depth,
                        ssd.io_backend, layer_dtype)


def layer_widths(config: Config, store: Store) -> list[int]:
    """Output width of each layer of the config's built-in model."""
    return [config.model.hidden] * (config.model.layers - 1) + \
        [trainer_class(config.task).output_dim(config, store)]


def layer_dtype(config: Config, store: Store, layers: int, out: Path | None, last_written: bool = True) -> np.dtype:
    """The layer files' dtype: float32, or float16 when float32 files would not fit (half
    the bytes; activations keep ~3 significant digits). Refuses before computing when even
    float16 ones cannot fit: a layer's input and output files exist together (the last
    layer's only if `last_written`), and the output .npy (`out`, float32 rows of the last
    layer) beside them, in the free space of the run directory's filesystem (and of `out`'s)."""
    if config.features != "ssd":
        return np.dtype(np.float32)  # layers stay in RAM
    widths = layer_widths(config, store)[:layers]
    written = widths if last_written else widths[:-1]
    run_dir = config.run_path()
    for dtype in (np.dtype(np.float32), np.dtype(np.float16)):
        files = [-(-store.num_nodes * w * dtype.itemsize // PAGE) * PAGE for w in written] or [0]
        scratch = max(a + b for a, b in zip(files, files[1:])) if len(files) > 1 else files[0]
        places = {run_dir: scratch}
        if out is not None:
            output = store.num_nodes * widths[-1] * 4
            if os.stat(out.parent).st_dev == os.stat(run_dir).st_dev:
                places[run_dir] = max(scratch, files[-1] + output)
            else:
                places[out.parent] = output
        free = {place: shutil.disk_usage(place).free for place in places}
        short = [(place, needed, free[place]) for place, needed in places.items() if needed > free[place]]
        if not short:
            if dtype == np.float16:
                log.info("layer files as float16: float32 ones would not fit the free disk")
            return dtype
    place, needed, free = short[0]
    raise ConfigError(f"not enough free disk for layer-wise inference: it needs about "
                      f"{format_bytes(needed)} under {place} ({len(written)} layer files of "
                      f"{store.num_nodes:,} rows x {written} float16: a layer's input and "
                      f"output files together{', and the float32 output' if out is not None else ''}); "
                      f"{format_bytes(free)} is free there. Free some space, or use a "
                      "narrower model (model.hidden) or fewer layers (--layer)")


def embed(config: Config, out: Path, layers: int | None = None) -> tuple[int, int]:
    """Write the embeddings (layer `layers`, default the last) of every node as an .npy in
    original node order; returns its shape. Holds the run directory's reader lock; layer
    files go to this process's scratch directory in it."""
    with reading(config.run_path()) as scratch:
        model = trained_model(config)
        if layers is not None and not 1 <= layers <= model.num_layers:
            raise ValueError(f"--layer {layers}: the model has layers 1..{model.num_layers}")
        store = Store.open(config.store_path())
        dtype = layer_dtype(config, store, layers or model.num_layers, out)
        chunks = layerwise_inference(model, store, config.features, config.ssd, scratch.path, layers, dtype)
        return _write_npy(out, chunks, store.num_nodes)


def predict_layerwise(config: Config) -> np.ndarray:
    """Every node's predicted class (original IDs) by layer-wise inference of a node
    run's best model, under the run directory's reader lock. In ssd mode the last layer's
    rows are reduced to their argmax as they are computed (never written)."""
    if not trainer_class(config.task).CLASSIFIES:
        raise ConfigError(f"predict is for a node classification task, not task: {config.task}; "
                          "use `gnnssd embed`")
    with reading(config.run_path()) as scratch:
        store = Store.open(config.store_path())
        dtype = layer_dtype(config, store, config.model.layers, None, last_written=False)
        model = trained_model(config)
        if config.features != "ssd":
            chunks = layerwise_inference(model, store, config.features, config.ssd)
            return np.concatenate([chunk.argmax(1) for chunk in chunks])
        by_store_id = np.empty(store.num_nodes, np.int64)
        runner = _runner(store, config.ssd, scratch.path, dtype)
        try:
            n = 0
            for h in runner.store_order_outputs(model):
                by_store_id[n:n + len(h)] = h.argmax(1).numpy()
                n += len(h)
        finally:
            runner.close()
        return by_store_id[np.asarray(store.inv)]


def _write_npy(out: Path, chunks: Iterator[np.ndarray], total: int) -> tuple[int, int]:
    """The float32 rows of `chunks` (`total` in all) as the .npy `out`, written to a
    unique temporary file (removed on failure) and renamed into place."""
    n = dim = 0
    with atomic_output(out) as tmp, open(tmp, "wb") as f:
        for chunk in chunks:
            if n == 0:
                dim = chunk.shape[1]
                np.lib.format.write_array_header_1_0(
                    f, {"descr": "<f4", "fortran_order": False, "shape": (total, dim)})
            f.write(np.ascontiguousarray(chunk, np.float32).tobytes())
            n += len(chunk)
    return n, dim
