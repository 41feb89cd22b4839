"""Layer-wise inference: equal to full-neighbour sampled inference of the same model, in
memory and through scratch files on disk (mean layers by sequential passes too); `embed`
and `predict --layerwise` in original IDs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnssd.cli.commands import main
from gnnssd.core.config import ModelConfig, load_config
from gnnssd.core.timing import StageTimer
from gnnssd.datasets import ArraySource
from gnnssd.inference import mean as layerwise_mean
from gnnssd.cli.layerwise_commands import embed
from gnnssd.inference.blocks import chunk_bounds
from gnnssd.inference.layerwise import LayerwiseSSD, layerwise_memory
from gnnssd.inference.mean import bucket_in_edges, sum_ranges
from gnnssd.loading.backends.memory import MemoryLoader
from gnnssd.loading.types import load_features
from gnnssd.models.builtin import build_model
from gnnssd.sampler import Sequential, node_order, seed_batches
from gnnssd.storage_format import Store, write_store
from gnnssd.training.rundir import RunDirBusy, RunLock
from gnnssd.training.tasks import Trainer

from tests.conftest import random_graph_arrays


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    arrays = random_graph_arrays(num_nodes=500, num_edges=4000, dim=12, classes=5)
    out = tmp_path_factory.mktemp("layerwise") / "store"
    return Store.open(write_store(out, ArraySource(**arrays), order=node_order("degree")))


def _sampled_reference(model, store) -> np.ndarray:
    """Every node's output from DGL-sampled blocks with all neighbours, in store order."""
    loader = MemoryLoader(store, torch.device("cpu"), StageTimer())
    out = np.empty((store.num_nodes, 0), np.float32)
    with torch.no_grad():
        seeds = np.arange(store.num_nodes)
        for batch in loader.minibatches(seed_batches(seeds, 128, Sequential(), 0, 0), [-1] * model.num_layers):
            h = model(batch.blocks, batch.x).numpy()
            if out.shape[1] == 0:
                out = np.empty((store.num_nodes, h.shape[1]), np.float32)
            out[batch.output_nodes.numpy()] = h
    return out


@pytest.mark.parametrize("name", ["sage", "gat", "mlp"])
def test_layerwise_equals_full_neighbour_sampled_inference(store, tmp_path, name):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, hidden=16, layers=2, heads=2), store.feat_dim, 5).eval()
    reference = _sampled_reference(model, store)
    in_memory = layerwise_memory(model, store, load_features(store), budget=16 << 10).numpy()
    np.testing.assert_allclose(in_memory, reference, rtol=1e-4, atol=1e-5)
    runner = LayerwiseSSD(store, tmp_path / "scratch", budget=16 << 10)  # a part of the rows cached
    try:
        assert len(chunk_bounds(store.indptr, store.row_bytes, 16 << 10)) > 1  # many chunks
        path, dim = runner.run(model)
        on_disk = np.fromfile(path, np.float32, count=store.num_nodes * dim).reshape(-1, dim)
        assert path.stat().st_size % 4096 == 0  # page-aligned scratch feature file
        assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == ["layer1.bin"]  # layer 0's is gone
        np.testing.assert_allclose(on_disk, reference, rtol=1e-4, atol=1e-5)
        assert runner.bytes_read >= store.feature_bytes
    finally:
        runner.close()


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_embed_and_predict_layerwise_are_in_original_ids(store, tmp_path, features):
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        f"store: {store.path}\nrun_dir: {tmp_path / 'run'}\nfeatures: {features}\n"
        "model: {name: sage, hidden: 8, layers: 2}\nsampler: {fanouts: [5, 5], batch_size: 64}\n"
        "train: {epochs: 1, progress: false}\nssd: {memory_budget: 16MiB}\n")
    trainer = Trainer(config_file)
    trainer.fit()
    trainer.close()
    model = trainer.model.eval()
    perm = np.asarray(store.perm)
    by_original = np.empty((store.num_nodes, 5), np.float32)
    by_original[perm] = _sampled_reference(model, store)
    assert main(["embed", "--config", str(config_file), "--out", str(tmp_path / "emb.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), by_original, rtol=1e-4, atol=1e-5)
    assert main(["embed", "--config", str(config_file), "--out", str(tmp_path / "h1.npy"), "--layer", "1"]) == 0
    assert np.load(tmp_path / "h1.npy").shape == (store.num_nodes, 8)
    assert main(["predict", "--config", str(config_file), "--out", str(tmp_path / "p.npy"), "--layerwise"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), by_original.argmax(1))
    left = {p.name for p in (tmp_path / "run").iterdir()}
    assert not left & {"layerwise", ".gnnssd-scratch"}  # layer files went to the process's scratch, removed
    writer = RunLock(tmp_path / "run", exclusive=True)  # a training run holds the directory
    try:
        with pytest.raises(RunDirBusy, match="in use by training process"):
            embed(load_config(config_file), tmp_path / "busy.npy")
    finally:
        writer.release()


def test_in_edges_bucketed_by_source_segment_as_numpy_groups_them():
    rng = np.random.default_rng(0)
    degree = rng.integers(0, 9, 300)
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    indices = rng.integers(0, 300, indptr[-1]).astype(np.int32)
    lo, hi, segment_rows = 40, 250, 32
    sources, dests, starts = bucket_in_edges(indptr, indices, lo, hi, segment_rows, 10)
    edges = np.arange(indptr[lo], indptr[hi])
    edge_dst = np.repeat(np.arange(lo, hi), degree[lo:hi]) - lo
    order = np.lexsort((edge_dst, indices[edges] // segment_rows))  # by segment, then destination
    np.testing.assert_array_equal(sources, indices[edges][order])
    np.testing.assert_array_equal(dests, edge_dst[order])
    np.testing.assert_array_equal(np.diff(starts), np.bincount(indices[edges] // segment_rows, minlength=10))


@pytest.mark.parametrize("compiled", [False, True])
def test_mean_layers_by_sequential_passes_equal_the_gathered_layers(store, tmp_path, monkeypatch, compiled):
    monkeypatch.setattr(layerwise_mean, "SEGMENT_BYTES", 480)  # 10 rows of layer 0 a segment
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="sage", hidden=16, layers=2, compile=compiled), store.feat_dim, 5).eval()
    assert model.mean_aggregation(0) and model.mean_aggregation(1)
    gathered = layerwise_memory(model, store, load_features(store), budget=16 << 10).numpy()
    assert len(sum_ranges(store.indptr, store.feat_dim, 16 << 10)) > 1  # several passes a layer
    runner = LayerwiseSSD(store, tmp_path / "scratch", budget=16 << 10)
    try:
        path, dim = runner.run(model)
        on_disk = np.fromfile(path, np.float32, count=store.num_nodes * dim).reshape(-1, dim)
    finally:
        runner.close()
    np.testing.assert_allclose(on_disk, gathered, rtol=1e-4, atol=1e-5)


def test_only_mean_aggregation_layers_take_the_sequential_passes():
    for name, expected in [("gat", False), ("gcn", False), ("mlp", False)]:
        model = build_model(ModelConfig(name=name, hidden=8, layers=2, heads=2), 4, 3)
        assert model.mean_aggregation(0) is expected


def test_the_user_model_example_runs_layerwise_in_ssd_mode(store):
    """examples/layerwise_user_model.py: a model of the user's with the per-layer protocol;
    its layer-wise logits (ssd) equal its full-neighbour sampled ones through a NodeLoader,
    row for row by the dataset's node ID (the store is renumbered)."""
    import importlib.util

    import gnnssd

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("layerwise_user_model", REPO / "examples" / "layerwise_user_model.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.train(store, "ssd", "16MiB", epochs=1)
    logits = example.layerwise_logits(model, store, "ssd", "16MiB")
    reference = np.empty_like(logits)
    with torch.no_grad(), gnnssd.NodeLoader(store, np.arange(store.num_nodes), fanouts=[-1, -1], batch_size=128,
                                            device="cpu") as loader:
        for batch in loader:
            reference[batch.output_nodes.numpy()] = model(batch.blocks, batch.x).numpy()
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-5)


def _trained_ssd_run(store, tmp_path):
    """The config file of a one-epoch ssd-mode run on `store`, trained (run in tmp_path/run)."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        f"store: {store.path}\nrun_dir: {tmp_path / 'run'}\nfeatures: ssd\n"
        "model: {name: sage, hidden: 8, layers: 2}\nsampler: {fanouts: [5, 5], batch_size: 64}\n"
        "train: {epochs: 1, progress: false}\nssd: {memory_budget: 16MiB}\n")
    trainer = Trainer(config_file)
    trainer.fit()
    trainer.close()
    return config_file


def test_layerwise_without_the_disk_for_its_layer_files_is_refused_before_computing(store, tmp_path, monkeypatch,
                                                                                       capsys):
    """embed and predict --layerwise in ssd mode refuse at once, with the numbers, when
    the free disk cannot hold a layer's input and output files (and the output)."""
    import shutil

    from gnnssd.cli import layerwise_commands as layerwise

    config_file = _trained_ssd_run(store, tmp_path)
    real = shutil.disk_usage
    monkeypatch.setattr(layerwise.shutil, "disk_usage", lambda path: real(path)._replace(free=4096))
    computed = []
    monkeypatch.setattr(LayerwiseSSD, "run", lambda *a, **k: computed.append(1))
    for argv in (["embed", "--out", str(tmp_path / "e.npy")], ["predict", "--layerwise", "--out", str(tmp_path / "p.npy")]):
        assert main([argv[0], "--config", str(config_file), *argv[1:]]) == 2
        err = capsys.readouterr().err
        assert "not enough free disk for layer-wise inference: it needs about" in err
        assert f"under {tmp_path / 'run'}" in err and "4 KiB is free there" in err
    assert not computed and not (tmp_path / "e.npy").exists() and not (tmp_path / "p.npy").exists()


def test_layer_files_fall_back_to_float16_when_float32_ones_would_not_fit(store, tmp_path, monkeypatch, caplog):
    """predict --layerwise writes no file for the last layer; with free space for layer 0's
    file as float16 (500 rows x 8 x 2 B, one page) but not as float32, it runs with float16
    layer files and predicts as the float32 run does (up to near-ties)."""
    import logging
    import shutil

    from gnnssd.cli import layerwise_commands as layerwise

    config_file = _trained_ssd_run(store, tmp_path)
    config = load_config(config_file)
    full = layerwise.predict_layerwise(config)
    real = shutil.disk_usage
    monkeypatch.setattr(layerwise.shutil, "disk_usage", lambda path: real(path)._replace(free=4096 * 2))
    with caplog.at_level(logging.INFO, logger="gnnssd.inference.layerwise"):
        halved = layerwise.predict_layerwise(config)
    assert "layer files as float16" in caplog.text
    assert np.mean(halved == full) >= 0.98
    monkeypatch.setattr(layerwise.shutil, "disk_usage", lambda path: real(path)._replace(free=4096))
    with pytest.raises(layerwise.ConfigError, match=r"needs about 8 KiB .* float16"):
        layerwise.predict_layerwise(config)
