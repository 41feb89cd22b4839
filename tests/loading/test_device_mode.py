"""`features: device` on the CPU: the store streamed onto the device (checksums checked on the
way, through a bounce buffer within the budget, refused when it does not fit), mini-batches
sampled there as CSC blocks whose rows and labels are the store's, the ssd mode's draws
(LABOR: the same mini-batches), and training through the Trainer and the CLI."""
from __future__ import annotations

import time

import dgl
import numpy as np
import pytest
import torch

from gnnssd import EdgeLoader, NodeLoader
from gnnssd.compiler import CSCBlock
from gnnssd.core.config import ConfigError, config_from_dict
from gnnssd.datasets import synthetic_source
from gnnssd.loading.backends.device import Bounce
from gnnssd.pipeline import DirectIO
from gnnssd.sampler import node_order
from gnnssd.storage_format import PageChecksumError, Store, StoreError, write_store
from gnnssd.training.tasks import Trainer
from tests.hetero_graph import ToyHeteroSource


def _source():
    return synthetic_source(num_nodes=3000, feat_dim=16, num_classes=4, avg_degree=8, train_fraction=0.5)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("device") / "store", _source(), order=node_order("degree"))


def _loader(store, **options):
    options = {"fanouts": [4, 3], "batch_size": 128, "features": "device", "device": "cpu", "seed": 5,
               "shuffle": True, **options}
    return NodeLoader(store, store.train_idx, **options)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_batches_carry_the_stores_rows_and_labels_in_its_dtype(tmp_path, dtype):
    """x is each input node's stored row as float32 (float16 kept as float16 on the device,
    int8 dequantized as the store does), y the seeds' labels, blocks CSCBlocks whose node
    IDs (dgl.NID) are the dataset's; a tiny budget streams through many bounce buffers."""
    store = Store.open(write_store(tmp_path / "s", _source(), dtype=dtype, order=node_order("degree")))
    with _loader(store, memory_budget="16KiB") as loader:
        assert loader.backend.features.dtype == {"float32": torch.float32, "float16": torch.float16,
                                                 "int8": torch.int8}[dtype]
        seen = 0
        for mb in loader:
            np.testing.assert_array_equal(mb.x.numpy(), store.node_features(mb.input_nodes.numpy()))
            np.testing.assert_array_equal(mb.y.numpy(), store.node_labels(mb.output_nodes.numpy()))
            assert all(isinstance(b, CSCBlock) for b in mb.blocks) and mb.model_blocks is mb.blocks
            assert torch.equal(mb.blocks[0].srcdata[dgl.NID], mb.input_nodes)
            assert torch.equal(mb.blocks[-1].dstdata[dgl.NID], mb.output_nodes)
            seen += len(mb.output_nodes)
        assert seen == len(store.train_idx)
        np.testing.assert_array_equal(loader.backend.indices.numpy(), store.indices)
        np.testing.assert_array_equal(loader.backend.labels.numpy(), store.labels)


@pytest.mark.parametrize("method, fanouts", [("labor", [4, 3]), ("uniform", [-1, -1])])
def test_device_mode_draws_the_ssd_modes_minibatches(store_path, method, fanouts):
    """Same seed, LABOR or all neighbours: every mini-batch of an epoch has the ssd mode's
    input nodes, x and y (the numba sampler's draws, reproduced on tensors)."""
    store = Store.open(store_path)
    batches = {}
    for features in ("device", "ssd"):
        with _loader(store, features=features, method=method, fanouts=fanouts, memory_budget="32MiB") as loader:
            loader.set_epoch(2)
            batches[features] = [(mb.input_nodes, mb.x, mb.y) for mb in loader]
    assert len(batches["device"]) == len(batches["ssd"]) > 1
    for mine, theirs in zip(batches["device"], batches["ssd"]):
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b)


def test_a_corrupt_page_or_array_is_refused_while_loading(tmp_path):
    path = write_store(tmp_path / "s", _source())
    store = Store.open(path)  # checks the .npy files' CRCs now; they are damaged after
    with open(path / "indices.npy", "r+b") as f:
        f.seek(-3, 2)
        kept = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([kept[0] ^ 0x40]))
    with pytest.raises(StoreError, match=r"indices.npy: checksum mismatch while loading it onto cpu"):
        _loader(store)
    with open(path / "indices.npy", "r+b") as f:
        f.seek(-3, 2)
        f.write(kept)
    with open(path / "features.bin", "r+b") as f:
        f.seek(5000)
        f.write(b"\x01\x02")
    with pytest.raises(PageChecksumError, match=r"features.bin: page 1 "):
        _loader(Store.open(path))


def test_the_next_chunk_is_read_while_one_is_in_the_callers_hands(tmp_path):
    """The double-buffered load: each chunk the bounce buffer hands out holds the file's
    bytes, and while it is in the caller's hands (being checked and copied), the next chunk
    is already being read into the other half: it arrives there without the caller asking."""
    data = np.random.default_rng(0).integers(0, 256, 7 * 4096 + 100, dtype=np.uint8)  # a short last chunk
    path = tmp_path / "file.bin"
    path.write_bytes(data.tobytes())
    engine = DirectIO()
    try:
        bounce = Bounce(engine, 2 * 4096, torch.device("cpu"))
        assert bounce.half_bytes == 4096 and not np.shares_memory(*bounce.halves)
        out = torch.empty(len(data), dtype=torch.uint8)
        chunks = list(range(0, len(data), 4096))
        for k, (lo, half, chunk) in enumerate(bounce.chunks(path, len(data))):
            assert (lo, half) == (chunks[k], k % 2)
            np.testing.assert_array_equal(chunk, data[lo:lo + 4096])
            if k + 1 < len(chunks):  # the next chunk lands in the other half, unasked
                following = data[chunks[k + 1]:chunks[k + 1] + 4096]
                other = bounce.halves[1 - half][:len(following)]
                deadline = time.monotonic() + 60
                while not np.array_equal(other, following) and time.monotonic() < deadline:
                    time.sleep(0.01)
                np.testing.assert_array_equal(other, following)
            bounce.copy(half, chunk, out[lo:lo + len(chunk)])
        bounce.finish()
        np.testing.assert_array_equal(out.numpy(), data)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("damaged, error, message", [
    ("features.bin", PageChecksumError, r"features.bin: page 30 "),
    ("indices.npy", StoreError, r"indices.npy: checksum mismatch while loading it onto cpu")])
def test_a_corrupt_chunk_past_the_first_is_refused_naming_the_file(tmp_path, damaged, error, message):
    """A tiny budget streams the files through many chunks of both halves: a damaged page
    far from the start (features.bin's page 30, the middle of indices.npy) is still caught,
    naming the file."""
    path = write_store(tmp_path / "s", _source())
    store = Store.open(path)
    at = 30 * 4096 + 100 if damaged == "features.bin" else (path / damaged).stat().st_size // 2
    with open(path / damaged, "r+b") as f:
        f.seek(at)
        kept = f.read(1)
        f.seek(at)
        f.write(bytes([kept[0] ^ 0x40]))
    with pytest.raises(error, match=message):
        _loader(store, memory_budget="16KiB")


def test_typed_stores_and_edge_batches_are_refused_naming_the_alternatives(tmp_path, store_path):
    """What the device backend does not serve yet (issue 47): a heterogeneous store (the
    tensor sampler takes one node and edge type) and edge mini-batches (no exclusion of a
    batch's positive edges); both refusals name what does."""
    typed = write_store(tmp_path / "typed", ToyHeteroSource(papers=300, authors=200, institutions=5, feat_dim=8))
    with pytest.raises(ConfigError, match=r"features: device: the store .*typed is heterogeneous \(paper, "
                                          r".*\); device sampling takes one node and edge type for now: use "
                                          r"features: memory or ssd"):
        NodeLoader(typed, {"paper": Store.open(typed).train_idx}, fanouts=[3, 3], batch_size=64, features="device",
                   device="cpu")
    store = Store.open(store_path)
    edges = np.stack([store.indices[:100].astype(np.int64), np.zeros(100, np.int64)], axis=1)
    with pytest.raises(ValueError, match=r"features: 'device'; expected one of \('memory', 'ssd'\)"):
        EdgeLoader(store, edges, fanouts=[3, 3], batch_size=16, features="device", device="cpu")


def test_a_store_that_does_not_fit_is_refused_naming_the_sizes(store_path):
    with pytest.raises(ConfigError, match=r"features: device needs .* on cpu for the store .*\(features \(float32\) "
                                          r".*topology .*labels .*less ssd.device_reserve 0.999"):
        _loader(Store.open(store_path), device_reserve=0.999)


def test_a_dgl_nn_layer_given_its_csc_blocks_names_the_compiled_layers(store_path):
    layer = dgl.nn.SAGEConv(16, 4, "mean")
    with _loader(Store.open(store_path)) as loader:
        mb = next(iter(loader))
        with pytest.raises(AttributeError, match="not a DGL graph.*compiled layers: gnnssd.compile"):
            layer(mb.blocks[0], mb.x)


def _config(store, run_dir, **top):
    return config_from_dict({
        "store": str(store), "run_dir": str(run_dir), "seed": 3, "device": "cpu",
        "model": {"name": "sage", "hidden": 32},
        "sampler": {"fanouts": [5, 5], "batch_size": 200},
        "train": {"epochs": 6, "lr": 0.01, "progress": False}, **top})


def test_training_on_device_mode_reaches_memory_modes_accuracy(store_path, tmp_path):
    """The built-in (compiled) GraphSAGE trains on the device's CSC blocks: its test accuracy
    is near memory mode's (same config and seed) and far above chance (1/4)."""
    accuracy = {}
    for features in ("memory", "device"):
        trainer = Trainer(_config(store_path, tmp_path / features, features=features))
        trainer.fit()
        accuracy[features] = trainer.evaluate("test")["accuracy"]
        trainer.close()
    assert accuracy["device"] > 0.5 and abs(accuracy["device"] - accuracy["memory"]) < 0.05, accuracy


def test_a_dgl_nn_model_is_refused_naming_the_compiled_alternatives(store_path, tmp_path):
    """model.compile: false builds dgl.nn layers, which take DGL graphs only."""
    with pytest.raises(ConfigError, match=r"runs only on DGL graphs, and features: device gives CSC blocks.*"
                                          r"model.compile: true.*features: memory or ssd"):
        Trainer(_config(store_path, tmp_path / "run", features="device",
                        model={"name": "sage", "hidden": 32, "compile": False}))


def test_the_config_takes_device_and_its_reserve_and_refuses_bad_values(store_path, tmp_path):
    config = _config(store_path, tmp_path, features="device", ssd={"device_reserve": 0.3})
    assert config.features == "device" and config.ssd.device_reserve == 0.3
    with pytest.raises(ConfigError, match=r"ssd.device_reserve: 1.5 is invalid; expected in \[0, 1\)"):
        _config(store_path, tmp_path, features="device", ssd={"device_reserve": 1.5})
    with pytest.raises(ConfigError, match=r"features: 'gpu' is invalid; expected one of \['memory', 'ssd', 'device'\]"):
        _config(store_path, tmp_path, features="gpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
def test_on_a_gpu_the_load_goes_through_pinned_halves_and_equals_the_store(store_path):
    """On CUDA the bounce halves are pinned and the copies non-blocking on the copy stream,
    each half read into again only after its copy: with a tiny budget (many chunks per
    half), the arrays on the GPU are the store's."""
    store = Store.open(store_path)
    engine = DirectIO()
    try:
        assert all(torch.from_numpy(h).is_pinned() for h in Bounce(engine, 8192, torch.device("cuda")).halves)
    finally:
        engine.shutdown()
    with _loader(store, device="cuda", memory_budget="16KiB") as loader:
        backend = loader.backend
        assert backend.features.is_cuda
        np.testing.assert_array_equal(backend.features.cpu().numpy(), store.read_features())
        np.testing.assert_array_equal(backend.indptr.cpu().numpy(), store.indptr)
        np.testing.assert_array_equal(backend.indices.cpu().numpy(), store.indices)
        np.testing.assert_array_equal(backend.labels.cpu().numpy(), store.labels)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("method", ["uniform", "labor"])
def test_on_a_gpu_the_minibatches_are_those_of_the_cpu(store_path, method):
    """features: device on CUDA (the device check runs it): the store's arrays on the GPU,
    every mini-batch's blocks, x and y equal to the same loader's on the CPU (the draws
    are counter-based: the same on any device)."""
    store = Store.open(store_path)
    batches = {}
    for device in ("cpu", "cuda"):
        with _loader(store, device=device, method=method) as loader:
            batches[device] = [mb for mb in loader]
    assert batches["cuda"][0].x.is_cuda and batches["cuda"][0].blocks[0].indptr.is_cuda
    for a, b in zip(batches["cpu"], batches["cuda"]):
        assert torch.equal(a.x, b.x.cpu()) and torch.equal(a.y, b.y.cpu())
        assert torch.equal(a.input_nodes, b.input_nodes.cpu())
        for x, y in zip(a.blocks, b.blocks):
            assert torch.equal(x.indptr, y.indptr.cpu()) and torch.equal(x.indices, y.indices.cpu())
