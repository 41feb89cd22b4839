"""The `embed` and `predict --layerwise` commands: a trained run's model, layer-wise
inference (gnnssd.inference) over every node, and the output written or reduced. They read a
run directory (its checkpoint, under its reader lock), so they live with the commands, and
gnnssd.inference needs nothing of training."""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
from torch import nn

from gnnssd.core import Config, ConfigError, format_bytes
from gnnssd.inference import layerwise_inference, output_rows, ssd_runner
from gnnssd.loading import backend_class
from gnnssd.models import store_model
from gnnssd.storage_format import PAGE, Store, atomic_file
from gnnssd.training import check_classifies, load_checkpoint, reading, trainer_class

log = logging.getLogger("gnnssd.inference.layerwise")  # layer-wise inference's one log


def trained_model(config: Config) -> nn.Module:
    """The config's built-in model with the best weights of its run directory's checkpoint
    (a link run's encoder)."""
    store = Store.open(config.store_path())
    task = trainer_class(config.task)
    model = store_model(config.model, store, task.output_dim(config, store))
    checkpoint = load_checkpoint(config.run_path(), store, model)
    if checkpoint is None:
        raise RuntimeError(f"{config.run_path()}: no checkpoint; train first")
    state = checkpoint["best"]["state"] or checkpoint["model"]
    prefix = task.ENCODER_PREFIX
    state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    model.load_state_dict(state)
    return model


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
    if not backend_class(config.features).OUT_OF_CORE:
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
    original node order (a typed store's target-type nodes by their IDs within the type);
    returns its shape. Holds the run directory's reader lock; layer files go to this
    process's scratch directory in it."""
    with reading(config.run_path()) as scratch:
        model = trained_model(config)
        if layers is not None and not 1 <= layers <= model.num_layers:
            raise ValueError(f"--layer {layers}: the model has layers 1..{model.num_layers}")
        store = Store.open(config.store_path())
        dtype = layer_dtype(config, store, layers or model.num_layers, out)
        chunks = layerwise_inference(model, store, config.features, config.ssd, scratch.path, layers, dtype)
        return _write_npy(out, chunks, len(output_rows(store)))


def predict_layerwise(config: Config) -> np.ndarray:
    """Every node's predicted class (original IDs; a typed store's target-type nodes by
    their IDs within the type) by layer-wise inference of a node run's best model, under
    the run directory's reader lock. In ssd mode the last layer's rows are reduced to their
    argmax as they are computed (never written)."""
    check_classifies(config)
    with reading(config.run_path()) as scratch:
        store = Store.open(config.store_path())
        dtype = layer_dtype(config, store, config.model.layers, None, last_written=False)
        model = trained_model(config)
        if not backend_class(config.features).OUT_OF_CORE:
            chunks = layerwise_inference(model, store, config.features, config.ssd)
            return np.concatenate([chunk.argmax(1) for chunk in chunks])
        rows = output_rows(store)
        by_store_id = np.empty(len(rows), np.int64)
        runner = ssd_runner(store, config.ssd, scratch.path, dtype)
        try:
            n = 0
            for h in runner.store_order_outputs(model):
                by_store_id[n:n + len(h)] = h.argmax(1).numpy()
                n += len(h)
        finally:
            runner.close()
        return by_store_id[rows]


def _write_npy(out: Path, chunks: Iterator[np.ndarray], total: int) -> tuple[int, int]:
    """The float32 rows of `chunks` (`total` in all) as the .npy `out`, written to a
    unique temporary file (removed on failure) and renamed into place."""
    n = dim = 0
    with atomic_file(out) as f:
        for chunk in chunks:
            if n == 0:
                dim = chunk.shape[1]
                np.lib.format.write_array_header_1_0(
                    f, {"descr": "<f4", "fortran_order": False, "shape": (total, dim)})
            f.write(np.ascontiguousarray(chunk, np.float32).tobytes())
            n += len(chunk)
    return n, dim
