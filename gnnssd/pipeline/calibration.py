"""Calibrate the read planner's cost model on the actual drive.

Measures, with O_DIRECT through the same I/O path the loader uses, random reads of several
request sizes at queue depth (request rate and bandwidth per size) and sequential write
bandwidth; fits `CostModel` (fixed cost per request + bytes at the large-read bandwidth)
and stores it with the raw table as calibration.json in the store directory.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.sampler import CostModel
from gnnssd.storage_format import PAGE, SmallFileError, StoreError, read_small_text, shown

CALIBRATION_FILE = "calibration.json"
CALIBRATION_BYTES = 1 << 20  # a model and a table of a few sizes: a few KiB
SIZES = (PAGE, 4 * PAGE, 16 * PAGE, 64 * PAGE, 1 << 20)
# What a measured model may hold: key -> (low, high), both inclusive. Bandwidths from a
# floppy's to past any drive's; request cost up to a second; max_request at most 64 MiB
# (the planner allocates buffers of that size).
MODEL_RANGES = {"request_s": (0.0, 1.0), "read_bw": (1e3, 1e12), "write_bw": (1e3, 1e12),
                "page": (PAGE, PAGE), "max_request": (PAGE, 64 << 20)}


def measure_reads(io: DirectIO, path: str | Path, size: int, seconds: float, seed: int = 0) -> dict:
    """Random aligned reads of `size` bytes at the io's queue depth, for about `seconds`,
    in sorted batches of at least 8 MiB."""
    f = io.open(path)
    try:
        slots = f.size // size
        if slots < 1:
            raise ValueError(f"{path} is smaller than one {size}-byte request")
        rng = np.random.default_rng(seed)
        batch = max(io.queue_depth * 4, (8 << 20) // size)
        buf = io.alloc(io.queue_depth * size)
        dest = (np.arange(batch) % io.queue_depth) * size  # slots reused: the data is not kept
        lengths = np.full(batch, size, np.int64)
        io.read_extents(f, np.sort(rng.integers(0, slots, batch)) * size, lengths, buf, dest)  # warm-up
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            # sorted, as plans issue their requests (lets the block layer merge neighbours)
            io.read_extents(f, np.sort(rng.integers(0, slots, batch)) * size, lengths, buf, dest)
            count += batch
        elapsed = time.perf_counter() - start
    finally:
        io.close(f)
    return {"size": size, "requests_per_s": count / elapsed, "bytes_per_s": count * size / elapsed}


def measure_write(directory: str | Path, nbytes: int = 256 << 20, chunk: int = 1 << 20) -> float:
    """Sequential buffered write + fsync bandwidth (how repack writes blocks), bytes/s."""
    data = os.urandom(chunk)
    start = time.perf_counter()
    # a fresh name (O_EXCL, no link followed), removed on close
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".gnnssd_calibration_write.") as f:
        for _ in range(nbytes // chunk):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
        return nbytes / (time.perf_counter() - start)


def calibrate(store_dir: str | Path, seconds: float = 1.0, queue_depth: int = 64, features: str = "features.bin") -> CostModel:
    """Measure the drive under `store_dir`, save calibration.json there, return the model."""
    store_dir = Path(store_dir)
    io = DirectIO(queue_depth=queue_depth)
    size = os.path.getsize(store_dir / features)
    try:
        table = [measure_reads(io, store_dir / features, s, seconds) for s in SIZES if s <= size]
    finally:
        io.shutdown()
    read_bw = max(t["bytes_per_s"] for t in table)
    small = table[0]
    model = CostModel(
        request_s=max(1.0 / small["requests_per_s"] - small["size"] / read_bw, 0.0),
        read_bw=read_bw,
        write_bw=measure_write(store_dir),
    )
    model.save(
        store_dir / CALIBRATION_FILE,
        {"reads": table, "queue_depth": queue_depth, "backend": io.backend, "page": PAGE},
    )
    return model


def load_cost_model(store_dir: str | Path) -> CostModel:
    """The store's calibrated model, or `CostModel.default()` when not calibrated."""
    path = _calibration(store_dir)
    return CostModel.default() if path is None else _read_model(path)


def _calibration(store_dir: str | Path) -> Path | None:
    """The store's calibration.json, or None where `gnnssd calibrate` has not written one."""
    path = Path(store_dir) / CALIBRATION_FILE
    return path if os.path.lexists(path) else None


def describe_model(store_dir: str | Path, model: CostModel) -> str:
    """What the read planner prices the drive with, for the loader's log: a default model
    misjudges a drive whose writes are slower than its reads, and packs too much (measured:
    docs/BENCHMARKS.md, issue 46, fourteenth round)."""
    rates = f"reads {model.read_bw / 1e9:.2f} GB/s, writes {model.write_bw / 1e9:.2f} GB/s"
    if _calibration(store_dir) is not None:
        return f"reads planned with the drive's calibration ({rates})"
    return (f"reads planned with a default model of the drive ({rates}): `gnnssd calibrate {store_dir}` "
            "measures this one")


def _read_model(path: Path) -> CostModel:
    """calibration.json's model, every field checked against MODEL_RANGES: the file is
    not part of the store's checksummed manifest, so it is validated like user input."""
    try:
        model = json.loads(read_small_text(path, CALIBRATION_BYTES, "calibration file"))["model"]
    except SmallFileError as exc:
        raise StoreError(f"{exc}; rerun `gnnssd calibrate` or delete it") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{path}: not a calibration file ({type(exc).__name__}: {exc}); "
                         "rerun `gnnssd calibrate` or delete it") from None
    if not isinstance(model, dict) or set(model) - set(MODEL_RANGES) or not {
            "request_s", "read_bw", "write_bw"} <= set(model):
        raise StoreError(f"{path}: model keys {shown(sorted(model) if isinstance(model, dict) else model, 200)}, "
                         f"expected request_s, read_bw, write_bw and optionally page, max_request; "
                         "rerun `gnnssd calibrate` or delete it")
    for key, value in model.items():
        low, high = MODEL_RANGES[key]
        integral = key in ("page", "max_request")
        if (isinstance(value, bool) or not isinstance(value, int if integral else (int, float))
                or not math.isfinite(value) or not low <= value <= high
                or integral and value % PAGE):
            raise StoreError(f"{path}: model.{key} is {shown(value, 100)}, expected "
                             f"{'a multiple of ' + str(PAGE) + ' in' if integral else 'a number in'} "
                             f"{low:g}..{high:g}; rerun `gnnssd calibrate` or delete it")
    return CostModel(**model)
