"""int8 feature rows: quantization error bound against a NumPy reference, the sidecar of row
scales in the manifest and `verify`, and the same float32 x in every loader mode."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import gnnssd
from gnnssd.datasets import ArraySource
from gnnssd.loading.types import load_features
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, StoreError, write_store
from gnnssd.storage_format.preprocess import features
from gnnssd.storage_format.quantize import dequantize_rows, quantize_rows

from tests.conftest import random_graph_arrays


def _reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row min/max affine quantization to 256 levels, in float64: (dequantized rows, step)."""
    x = x.astype(np.float64)
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    step = (high - low) / 255
    codes = np.rint((x - low) / np.where(step > 0, step, 1))
    return low + codes * step, step


def _agrees_with_reference(got: np.ndarray, want: np.ndarray, step: np.ndarray, slack: np.ndarray) -> None:
    """The same codes as the float64 reference, but for values at a rounding tie (float32
    vs float64 arithmetic), which may land one step apart."""
    off = np.abs(got - want)
    assert np.all(off <= step + slack)
    assert np.mean(off <= slack) > 0.999


def test_quantized_rows_are_within_half_a_step_of_the_input():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((500, 37)) * rng.uniform(0.01, 100, (500, 1))).astype(np.float32)
    x[7] = 3.5  # a constant row
    codes, params = quantize_rows(x)
    assert codes.dtype == np.int8 and params.dtype == np.float32 and params.shape == (500, 2)
    back = dequantize_rows(codes, params)
    want, step = _reference(x)
    slack = 1e-5 * np.abs(x).max(axis=1, keepdims=True)  # float32 rounding
    assert np.all(np.abs(back - x) <= step / 2 + slack)
    _agrees_with_reference(back, want, step, slack)
    np.testing.assert_array_equal(back[7], x[7])
    assert codes.min() == -128 and codes.max() == 127  # the whole range is used


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Store]:
    data = random_graph_arrays(num_nodes=3000, num_edges=20000, dim=16)
    root = tmp_path_factory.mktemp("int8")
    out = {dtype: Store.open(write_store(root / dtype, ArraySource(**data), order=node_order("degree"), dtype=dtype),
                             verify=True) for dtype in ("float32", "int8")}
    try:
        os.close(os.open(out["int8"].features_path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("the test directory refuses O_DIRECT (tmpfs?)")
    return out


def test_int8_store_holds_a_quarter_of_the_bytes_and_close_rows(stores: dict[str, Store]):
    f32, q = stores["float32"], stores["int8"]
    assert q.manifest["features"]["dtype"] == "int8" and q.row_bytes == f32.row_bytes // 4
    assert q.manifest["features"]["row_scales"] == "features.scale"
    assert q.manifest["files"]["features.scale"]["size"] == q.num_nodes * 8
    assert q.features_path.stat().st_size <= -(-f32.features_path.stat().st_size // 4 // 4096) * 4096
    assert "features.scale" in q.verify()
    exact = np.asarray(f32.read_features())
    want, step = _reference(exact)
    got = load_features(q).numpy()  # memory mode
    assert got.dtype == np.float32
    slack = 1e-5 * np.abs(exact).max(axis=1, keepdims=True)
    assert np.all(np.abs(got - exact) <= step / 2 + slack)
    _agrees_with_reference(got, want, step, slack)


def test_ssd_and_memory_modes_give_identical_x(stores: dict[str, Store]):
    store = stores["int8"]
    reference = load_features(store).numpy()
    for mode in ("memory", "ssd", "mmap", "per-row"):
        with gnnssd.NodeLoader(store, np.arange(store.num_nodes), fanouts=[4, 3], batch_size=500, features=mode,
                               memory_budget="15MiB", hot_fraction=0.001, mega_batch=2, shuffle=True,
                               seed=1, device="cpu") as loader:
            if mode == "ssd":  # most rows come through features.bin, not the hot cache
                assert len(loader.backend.hot.members.rows) < store.num_nodes // 2
            batches = 0
            for mb in loader:
                rows = np.asarray(store.inv)[mb.input_nodes.numpy()]  # input_nodes: the dataset's IDs
                np.testing.assert_array_equal(mb.x.numpy(), reference[rows], err_msg=mode)
                batches += 1
            assert batches == len(loader) > 1


def test_corrupt_or_missing_row_scales_are_named(tmp_path: Path):
    path = write_store(tmp_path / "s", ArraySource(**random_graph_arrays()), dtype="int8")
    scales = path / "features.scale"
    data = bytearray(scales.read_bytes())
    data[100] ^= 0x01
    scales.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="features.scale: checksum mismatch"):
        Store.open(path, verify=True)
    scales.unlink()
    with pytest.raises(StoreError, match="features.scale: missing"):
        Store.open(path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["files"]["features.scale"]["size"] == 300 * 8


def test_preprocess_stopped_before_the_int8_rows_replace_features_resumes(tmp_path: Path, monkeypatch):
    data = random_graph_arrays()
    whole = Store.open(write_store(tmp_path / "whole", ArraySource(**data), dtype="int8"))
    replace = os.replace

    def stop_at_the_swap(src, dst):
        if Path(src).name == "features.int8.bin":
            raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(features.os, "replace", stop_at_the_swap)
    with pytest.raises(KeyboardInterrupt):
        write_store(tmp_path / "s", ArraySource(**data), dtype="int8")
    assert not (tmp_path / "s").exists()
    monkeypatch.setattr(features.os, "replace", replace)
    resumed = Store.open(write_store(tmp_path / "s", ArraySource(**data), dtype="int8"), verify=True)
    np.testing.assert_array_equal(resumed.read_features(), whole.read_features())
    np.testing.assert_array_equal(resumed.row_scales, whole.row_scales)
