"""Layer-wise inference of every node, out of core.

Each layer is computed for all nodes over all their in-neighbours, in chunks of
destination nodes in store order (DGL's full-graph inference, done without holding the
graph's activations): a chunk's block holds the chunk's nodes first and then their other
in-neighbours, their input rows are read, the model's layer runs, and the chunk's output
rows are appended to the layer's output. In `ssd` mode the inputs are features.bin and
then each layer's page-aligned scratch feature file, read through the io_engine
(O_DIRECT) and written with O_DIRECT; in `memory` mode they are tensors in RAM (the
reference; gnnssd.inference.rows reads a layer's input either way). The chunk size
follows the memory budget.

In `ssd` mode a layer whose neighbour input is the mean of its in-neighbours' rows
(GraphSAGE-mean: `model.mean_aggregation(i)`) is computed instead by sequential passes over
its input file (gnnssd.inference.mean): gathering in-neighbour rows is one small read per row
on graphs without neighbourhood locality.

The model must expose the per-layer interface of gnnssd.models.builtin.BlockGNN:
`num_layers` and `layer(i, block, h)` (layer i on one DGL block, activation included), and
may expose `mean_aggregation(i)`.

One loop serves every store, a homogeneous one as the one-type case: each layer is
computed for every node of the types a later layer reads (gnnssd.inference.blocks.layer_types:
all the types the next layer's destinations and their in-neighbours are; at the last layer
the target type), type by type in chunks within the type's ID range, each type by its
strategy (sequential passes for a mean layer, else chunks over gathered in-neighbour rows
behind a cache of the most referenced ones); on a heterogeneous store (gnnssd.models.hetero'
models) as heterogeneous blocks over the typed CSC, `h` and the layer's output dicts of rows
by node type (gnnssd.inference.typed). Layer 0 reads the featured types' rows, and the
featureless types' zeros or the model's `embeddings[type]` rows; the layers' outputs are a
tensor, or a scratch file, per node type. Outputs are the target type's rows, by its dataset IDs.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from gnnssd.core import SSDConfig
from gnnssd.loading import FeatureSource, as_store, backend_class, load_features, plain_form_only, private_scratch
from gnnssd.models import is_mean_aggregation
from gnnssd.pipeline import BlockWriter, DirectIO, FeatureFile, load_cost_model
from gnnssd.sampler import hot_order
from gnnssd.storage_format import Store

from .blocks import CHUNK_SHARE, input_types, layer_types
from .mean import mean_layer_chunks
from .rows import Rows, StoredRows, TensorRows
from .typed import check_model_form, first_inputs, layer_chunks_of_type

log = logging.getLogger("gnnssd.inference.layerwise")

STAGING_BYTES = 8 << 20  # a layer file reader's staging: half read while the other half is copied
HOT_INDEX_BYTES = 5  # per row of a layer's input, a hot cache's membership mask (1 B) and slot map (4 B)
# A chunk's inputs take 1/CHUNK_SHARE of the budget (gnnssd.inference.blocks); in ssd mode half
# the budget caches the most referenced input rows of each layer.


def output_rows(store: Store) -> np.ndarray:
    """The row of the layer-wise outputs (store order within the target type) of each
    target-type node by its ID within the type: store.inv on a homogeneous store, whose
    one type starts at row 0."""
    t = store.schema.type_id(store.schema.target)
    lo, hi = (int(x) for x in store.schema.offsets[t:t + 2])
    return np.asarray(store.inv[lo:hi], np.int64) - lo if lo else np.asarray(store.inv[lo:hi])  # no copy from 0


@torch.no_grad()
def layerwise_memory(model: nn.Module, store: Store, features: torch.Tensor | None = None,
                     layers: int | None = None, budget: int = 256 << 20) -> torch.Tensor:
    """The target type's output of the first `layers` layers (default all), store order
    within the type, in RAM (a homogeneous store's: every node's, its one type), each
    layer's outputs a tensor per type the next layer reads. Without `features` (the featured
    types' rows) the store's are loaded here, and freed once layer 0 is done."""
    schema = store.schema
    check_model_form(model, schema)
    model.eval()
    types = layer_types(schema, layers or model.num_layers)
    inputs = first_inputs(model, store, TensorRows(load_features(store) if features is None else features),
                          input_types(schema, types[0]))
    del features
    for i, computed in enumerate(types):
        h = {schema.type_names[t]: _filled(layer_chunks_of_type(model, i, store, inputs, t, budget),
                                           schema.node_types[t].count) for t in computed}
        inputs = {name: TensorRows(rows) for name, rows in h.items()}
    return h[schema.target]


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

    Layer outputs go to `scratch_dir/layer{i}.type{t}.bin`, a file per node type (rows of
    `layer_dtype`: float32, or float16 where the disk cannot hold float32 ones; offset 0,
    padded to a page), each read back through the io_engine by the next layer and deleted
    after it; `run` writes the last layer's as `layer{i}.bin`.
    """

    def __init__(self, store: Store, scratch_dir: Path, budget: int, queue_depth: int = 128,
                 backend: str = "auto", layer_dtype: np.dtype = np.dtype(np.float32)):
        self.store, self.scratch_dir, self.budget = store, Path(scratch_dir), budget
        self.layer_dtype = np.dtype(layer_dtype)
        # page checksums for features.bin; the layer files are our own
        self.io = DirectIO(queue_depth, backend, checksums={store.features_path: store.page_checksums()})
        self.model = load_cost_model(store.path)
        self.bytes_read = self.bytes_written = 0
        self._rankings: dict[tuple[int, ...], np.ndarray] = {}  # see _ranking

    @torch.no_grad()
    def run(self, model: nn.Module, layers: int | None = None) -> tuple[Path, int]:
        """Compute layers 0..layers-1 (default all); returns the last layer's file and width
        (on a typed store the target type's rows)."""
        out = self.scratch_dir / f"layer{(layers or model.num_layers) - 1}.bin"
        with contextlib.closing(self.store_order_outputs(model, layers)) as chunks:  # inputs closed on error too
            return out, self._write(chunks, out)

    @torch.no_grad()
    def store_order_outputs(self, model: nn.Module, layers: int | None = None) -> Iterator[torch.Tensor]:
        """The rows of layer `layers` - 1 (default the last) of the target type (a
        homogeneous store's: every node, its one type) in store order, chunk by chunk, never
        written to disk: for a consumer that reduces each row (predict's argmax), one layer
        file less. Each earlier layer is written as a file per node type it computes, read
        by the next layer (through a cache of its most referenced rows, or by sequential
        passes for a mean-aggregation layer) and deleted after it."""
        store, schema = self.store, self.store.schema
        check_model_form(model, schema)
        model.eval()
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        types = layer_types(schema, layers or model.num_layers)
        reads = input_types(schema, types[0])
        features = self._rows(store.features_path, store.feat_dim, store.feat_dtype, store.as_float32)
        opened = [(features, store.features_path)]
        try:
            featured = [t for t in reads if schema.node_types[t].features]
            hot = self._hot(model, 0, types[0], featured, store.feature_rows, store.feat_dim)
            inputs = first_inputs(model, store, features.cached(hot, store.feature_rows), reads)
            for i, computed in enumerate(types[:-1]):
                written = {}
                for t in computed:
                    out = self.scratch_dir / f"layer{i}.type{t}.bin"
                    written[t] = out, self._write(self._type_chunks(model, i, inputs, t), out)
                for source, path in opened:
                    self._consumed(source, path)
                opened, inputs = [], {}
                dim = max(d for _, d in written.values())
                hot = self._hot(model, i + 1, types[i + 1], computed,
                                sum(schema.node_types[t].count for t in computed), dim)
                for t, (path, width) in written.items():
                    lo, hi = (int(x) for x in schema.offsets[t:t + 2])
                    source = self._rows(path, width, self.layer_dtype)
                    opened.append((source, path))
                    mine = hot[(hot >= lo) & (hot < hi)] - lo
                    inputs[schema.type_names[t]] = source.cached(mine, hi - lo)
            yield from self._type_chunks(model, len(types) - 1, inputs, schema.type_id(schema.target))
        finally:
            for source, path in opened:
                self._consumed(source, path)

    def _consumed(self, source: StoredRows, path: Path) -> None:
        """Close a layer's input, count its reads, and delete it if it is a layer file."""
        self._close(source)
        if path != self.store.features_path:
            path.unlink(missing_ok=True)

    def _close(self, rows: StoredRows) -> None:
        """Close rows `_rows` opened and count what was read of them."""
        file = rows.source  # the FeatureFile `_rows` opened
        file.close()
        self.bytes_read += file.bytes_read

    def _rows(self, path: Path, dim: int, dtype: np.dtype,
              as_float32: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> StoredRows:
        return StoredRows(FeatureFile(self.io, path, dim, dtype, self.model, STAGING_BYTES), as_float32)

    def _write(self, chunks: Iterator[torch.Tensor], out: Path) -> int:
        """Write the rows of `chunks` as the layer file `out`; returns their width."""
        first = next(chunks).contiguous()
        row_bytes = first.shape[1] * self.layer_dtype.itemsize
        with BlockWriter([out], row_bytes, self.io.alloc,
                         memory_bytes=min(self.budget // CHUNK_SHARE, 16 << 20)) as writer:
            for h in _prepend(first, chunks):
                raw = np.ascontiguousarray(h.numpy(), self.layer_dtype).view(np.uint8).reshape(-1)
                writer.append(0, raw, np.arange(len(h), dtype=np.int64) * row_bytes)
        self.bytes_written += os.path.getsize(out)
        return first.shape[1]

    @staticmethod
    def _by_passes(model: nn.Module, i: int) -> bool:
        """Whether layer i is computed by sequential passes: its neighbour input is the mean
        of its in-neighbours' rows (a one-type model's `mean_aggregation(i)`)."""
        return getattr(model, "mean_aggregation", lambda i: False)(i)

    def _type_chunks(self, model: nn.Module, i: int, inputs: dict[str, Rows],
                     t: int) -> Iterator[torch.Tensor]:
        """Layer i's output rows of node type t in store order, by the type's strategy:
        sequential passes over its input for a mean-aggregation layer, else chunks over
        gathered in-neighbour rows (gnnssd.inference.typed; its inputs cached by `_hot`)."""
        store = self.store
        if self._by_passes(model, i):
            source = inputs[store.schema.type_names[t]]
            # chunk inputs: own rows, means, their concatenation and the output
            chunk_rows = max(self.budget // CHUNK_SHARE // (source.dim * 4 * 4), 1)
            return mean_layer_chunks(model, i, source, store.indptr, store.indices, self.budget, chunk_rows)
        return layer_chunks_of_type(model, i, store, inputs, t, self.budget)

    def _hot(self, model: nn.Module, i: int, computed: list[int], files: list[int], slots: int,
             dim: int) -> np.ndarray:
        """The store IDs of nodes of types `files` (rows read from files) most referenced
        as in-neighbours of the types `computed`, as many rows of `dim` as half the budget
        holds beside the index of `slots` cache slots (HOT_INDEX_BYTES each); none for a
        layer i computed by sequential passes, which reads its input start to end."""
        count = max(self.budget // 2 - slots * HOT_INDEX_BYTES, 0) // (dim * 4)
        if self._by_passes(model, i) or count == 0:
            return np.empty(0, np.int64)
        read = np.zeros(self.store.num_nodes, bool)
        for t in files:
            read[self.store.schema.offsets[t]:self.store.schema.offsets[t + 1]] = True
        order = self._ranking(tuple(computed))
        return order[read[order]][:count]

    def _ranking(self, computed: tuple[int, ...]) -> np.ndarray:
        """Every node by how many in-neighbour lists of the types `computed` name it, most
        first (an argsort of all nodes): ranked once per run for each set of types (a
        homogeneous store's every layer has the same)."""
        if computed not in self._rankings:
            offsets = self.store.schema.offsets
            seeds = np.concatenate([np.arange(offsets[t], offsets[t + 1]) for t in computed])
            self._rankings[computed] = hot_order(self.store.indptr, self.store.indices, [-1], seeds)
        return self._rankings[computed]

    def original_order(self, layer_file: Path, dim: int) -> Iterator[np.ndarray]:
        """The layer file's rows in original node order (a typed store's target type's by
        their IDs within the type), in chunks within the budget."""
        inv = output_rows(self.store)
        rows = self._rows(layer_file, dim, self.layer_dtype)
        step = max(self.budget // CHUNK_SHARE // (dim * 4), 1)
        try:
            for lo in range(0, len(inv), step):
                yield rows.read(inv[lo:lo + step]).numpy()
        finally:
            self._close(rows)

    def close(self) -> None:
        self.io.shutdown()


def _prepend(first: torch.Tensor, rest: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    yield first
    yield from rest


def layerwise_inference(model: nn.Module, store: Store, features: str = "memory", ssd: SSDConfig | None = None,
                        scratch_dir: Path | None = None, layers: int | None = None,
                        layer_dtype: np.dtype = np.dtype(np.float32)) -> Iterator[np.ndarray]:
    """Every node's output of the first `layers` layers of `model` (any module with the
    per-layer interface: see the module docstring and examples/layerwise_user_model.py),
    in the dataset's node order (a typed store's: the target type's nodes by their IDs
    within the type), in chunks: computed in RAM (`features="memory"`) or through files
    of `layer_dtype` in `scratch_dir` (`"ssd"`, within `ssd.memory_budget`)."""
    ssd = ssd or SSDConfig()
    budget = ssd.memory_budget
    if not backend_class(features).OUT_OF_CORE:
        h = layerwise_memory(model, store, layers=layers, budget=budget)
        yield h[torch.from_numpy(output_rows(store))].numpy()
        return
    if scratch_dir is None:
        raise ValueError("layer-wise inference with features ssd needs a scratch_dir for its layer files")
    runner = ssd_runner(store, ssd, scratch_dir, layer_dtype)
    try:
        path, dim = runner.run(model, layers)
        yield from runner.original_order(path, dim)
        path.unlink()
    finally:
        runner.close()


def ssd_runner(store: Store, ssd: SSDConfig, scratch_dir: Path, layer_dtype: np.dtype) -> LayerwiseSSD:
    """Out-of-core layer-wise inference with the `ssd` settings, its layer files in `scratch_dir`."""
    return LayerwiseSSD(store, Path(scratch_dir) / "layerwise", ssd.memory_budget, ssd.queue_depth,
                        ssd.io_backend, layer_dtype)


class LayerList(nn.Module):
    """A user's model whose `layers` are modules taking (block, h), the shape of DGL's and
    GraphBolt's examples, as the per-layer interface above: layer i is `layers[i]`, then
    `activation` on every layer's output but the last's (what the examples' forward does
    between layers; their dropout is the identity in eval mode). A GraphSAGE-mean layer
    (dgl.nn.SAGEConv "mean") is computed by sequential passes in ssd mode."""

    def __init__(self, model: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        layers = getattr(model, "layers", None)
        if not isinstance(layers, (list, tuple, nn.ModuleList)) or not layers:
            raise TypeError(f"gnnssd.layerwise: the model ({type(model).__name__}) needs `layers`, a non-empty "
                            "list (nn.ModuleList) of modules each called as layer(block, h)")
        self.model, self.activation = model, activation
        self.steps = list(layers)

    @property
    def num_layers(self) -> int:
        return len(self.steps)

    def layer(self, i: int, block: Any, h: torch.Tensor) -> torch.Tensor:
        h = self.steps[i](block, h)
        return self.activation(h) if i < self.num_layers - 1 else h

    def mean_aggregation(self, i: int) -> bool:
        return is_mean_aggregation(self.steps[i])


@torch.no_grad()
def layerwise(model: nn.Module, source: Any, *, features: str | None = None, memory_budget: int | str | None = None,
              activation: Callable[[torch.Tensor], torch.Tensor] = torch.relu, layers: int | None = None,
              scratch_dir: str | Path | None = None) -> torch.Tensor:
    """Every node's output of a user's model by layer-wise inference, row k for the
    dataset's node k (float32, on the CPU): each layer for all nodes over all their
    in-neighbours before the next, as DGL's and GraphBolt's `inference` examples do, equal
    to mini-batch inference with every neighbour (fanouts -1).

    `model.layers`: modules each called as layer(block, h) (see LayerList: `activation`,
    default ReLU, follows every layer but the last; dropout is left out, as in eval mode).
    `source`: a FeatureSource (its features mode, memory budget and, in memory mode, the
    features it holds), or a Store or its path, opened with `features` (default memory)
    and `memory_budget` (ssd mode: the layers' activations go to files of the scratch
    directory, a private temporary one by default, and are read back within the budget).
    `layers`: the first that many layers only (an embedding). The model's train/eval mode
    is restored afterwards. A homogeneous store's nodes (a heterogeneous one: `gnnssd embed`
    with the built-in models)."""
    opened = source if isinstance(source, FeatureSource) else None
    store = as_store(source.store if opened else source)
    plain_form_only(store.schema, ValueError(
        f"gnnssd.layerwise: {store.path} is a heterogeneous store; its layer-wise inference takes "
        "a typed model (gnnssd.models.hetero: `gnnssd embed`)"))
    if opened is not None and (features is not None or memory_budget is not None):
        raise TypeError("gnnssd.layerwise: features and memory_budget are the FeatureSource's; pass a Store to "
                        "choose them here")
    features = opened.features if opened else features or "memory"
    ssd = opened.ssd if opened else SSDConfig() if memory_budget is None else SSDConfig(memory_budget=memory_budget)
    steps, training = LayerList(model, activation), model.training
    if layers is not None and not 1 <= layers <= steps.num_layers:
        raise ValueError(f"layers: {layers}; the model has layers 1..{steps.num_layers}")
    try:
        if not backend_class(features).OUT_OF_CORE:
            held = getattr(opened._backend, "features", None) if opened else None  # memory mode's rows, loaded once
            h = layerwise_memory(steps, store, held if isinstance(held, torch.Tensor) else None, layers, ssd.memory_budget)
            return h[torch.from_numpy(output_rows(store))]
        scratch = Path(scratch_dir) if scratch_dir is not None else None
        own = scratch is None
        scratch = scratch or private_scratch()
        try:
            rows = list(layerwise_inference(steps, store, features, ssd, scratch, layers))
            return torch.from_numpy(np.concatenate(rows))
        finally:
            if own:
                shutil.rmtree(scratch, ignore_errors=True)
    finally:
        model.train(training)
