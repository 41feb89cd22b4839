"""Layer-wise inference on a heterogeneous store: the target type's outputs equal the model
applied to DGL's own full-neighbour blocks of the store's DGLHeteroGraph (R-GCN and R-GAT,
featureless types as zeros or learned rows, rows from RAM or through the io_engine, a budget
that forces many chunks); `predict --layerwise` and `embed` through the CLI agree with them
and with sampled `predict` over all neighbours, by the target type's IDs."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnssd.cli.commands import main
from gnnssd.core.config import ModelConfig, SSDConfig
from gnnssd.inference.blocks import chunk_bounds, input_types, layer_types
from gnnssd.inference.layerwise import LayerwiseSSD, layerwise_inference
from gnnssd.models.hetero import build_hetero_model
from gnnssd.storage_format import Store, write_store
from gnnssd.training.tasks import Trainer
from tests.hetero_graph import ToyHeteroSource

BUDGET = 64 << 10  # several chunks of each type a layer
SMALL_BUDGET = 16 << 10  # ssd: part of a layer's input rows cached


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    source = ToyHeteroSource(papers=300, authors=200, institutions=20, feat_dim=8)
    return source, Store.open(write_store(tmp_path_factory.mktemp("hetero-layerwise") / "store", source))


def _reference(model, source, store, layers: int) -> np.ndarray:
    """Every paper's output of the first `layers` layers on DGL's full-neighbour blocks of
    the store's heterograph, by paper ID."""
    papers = torch.arange(source.schema.node_types[0].count)
    _, seeds, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(layers).sample_blocks(
        store.graph(), {"paper": papers})
    assert torch.equal(seeds["paper"], papers)
    x = {"paper": torch.from_numpy(source.features[blocks[0].srcnodes["paper"].data[dgl.NID].numpy()])}
    with torch.no_grad():
        h = model.inputs(blocks[0], x)
        for i, block in enumerate(blocks):
            h = model.layer(i, block, h)
    return h["paper"].numpy()


def _layerwise(model, store, features, tmp_path, layers=None) -> np.ndarray:
    chunks = layerwise_inference(model, store, features, SSDConfig(memory_budget=f"{BUDGET}B"),
                                 tmp_path / "scratch", layers)
    return np.concatenate(list(chunks))


def test_each_layer_computes_the_types_a_later_layer_reads(toy):
    _, store = toy
    schema = store.schema  # paper 0, author 1, institution 2
    assert layer_types(schema, 1) == [[0]]
    assert layer_types(schema, 2) == [[0, 1], [0]]  # papers read papers (cites) and authors (writes)
    assert layer_types(schema, 3) == [[0, 1, 2], [0, 1], [0]]
    assert input_types(schema, [2]) == [1, 2]  # institutions: their authors


# every pair of (rows, model, featureless types) values once
@pytest.mark.parametrize("features,name,featureless", [("memory", "rgcn", "zeros"), ("memory", "rgat", "embedding"),
                                                       ("ssd", "rgcn", "embedding"), ("ssd", "rgat", "zeros")])
def test_layerwise_equals_the_model_on_dgl_full_neighbour_blocks(toy, tmp_path, name, featureless, features):
    source, store = toy
    torch.manual_seed(0)
    model = build_hetero_model(ModelConfig(name=name, hidden=16, layers=3, heads=2, featureless=featureless),
                               store.schema, store.feat_dim, 4).eval()
    lo, hi = store.schema.offsets[:2]
    assert len(chunk_bounds(store.indptr[lo:hi + 1], store.feat_dim * 4, BUDGET)) > 2  # many chunks
    np.testing.assert_allclose(_layerwise(model, store, features, tmp_path),
                               _reference(model, source, store, 3), rtol=1e-4, atol=1e-4)
    if features == "ssd":
        assert not list((tmp_path / "scratch" / "layerwise").iterdir())  # every layer file deleted


def test_the_first_layers_only_as_embed_layer_takes_them(toy, tmp_path):
    source, store = toy
    torch.manual_seed(0)
    model = build_hetero_model(ModelConfig(name="rgcn", hidden=16, layers=3, featureless="embedding"),
                               store.schema, store.feat_dim, 4).eval()
    np.testing.assert_allclose(_layerwise(model, store, "ssd", tmp_path, layers=2),
                               _reference(model, source, store, 2), rtol=1e-4, atol=1e-4)


def test_ssd_layers_read_through_the_engine_with_part_of_their_rows_cached(toy, tmp_path):
    """features.bin and each layer's file per node type are read through the io_engine
    within a budget whose cache holds only part of their rows (8 KiB: 218 of the 300
    feature rows, 96 of layer 0's 500 rows), exactly; layer files are deleted once read."""
    source, store = toy
    torch.manual_seed(0)
    model = build_hetero_model(ModelConfig(name="rgcn", hidden=16, layers=2), store.schema, store.feat_dim, 4)
    runner = LayerwiseSSD(store, tmp_path / "scratch", budget=SMALL_BUDGET)
    try:
        path, dim = runner.run(model)
        on_disk = np.fromfile(path, np.float32, count=300 * dim).reshape(-1, dim)
        assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == ["layer1.bin"]
        assert runner.bytes_read >= store.feature_bytes + (300 + 200) * 16 * 4  # layer 0's: papers, authors
        assert runner.bytes_written >= (300 + 200) * 16 * 4
    finally:
        runner.close()
    np.testing.assert_allclose(on_disk, _reference(model.eval(), source, store, 2), rtol=1e-4, atol=1e-4)


def test_mlp_on_the_target_type_layerwise(toy, tmp_path):
    source, store = toy
    model = build_hetero_model(ModelConfig(name="mlp", layers=1), store.schema, store.feat_dim, 4).eval()
    with torch.no_grad():
        expected = model.linear(torch.from_numpy(source.features)).numpy()
    for features in ("memory", "ssd"):
        np.testing.assert_allclose(_layerwise(model, store, features, tmp_path), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_predict_layerwise_and_embed_through_the_cli_by_target_type_ids(toy, tmp_path, features):
    source, store = toy
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        f"store: {store.path}\nrun_dir: {tmp_path / 'run'}\nfeatures: {features}\n"
        "model: {name: rgcn, hidden: 8, layers: 2, featureless: embedding}\n"
        "sampler: {fanouts: [{cites: 5, writes: 3, written_by: 3, employs: 2, affiliated_with: 1}, 5], "
        "batch_size: 64, eval_fanouts: [-1, -1]}\n"
        "train: {epochs: 1, progress: false}\nssd: {memory_budget: 16MiB}\n")
    trainer = Trainer(config_file)
    try:
        trainer.fit()
        sampled = trainer.predict()  # all neighbours: the same predictions
        reference = _reference(trainer.model.eval(), source, store, 2)
    finally:
        trainer.close()
    assert main(["predict", "--config", str(config_file), "--out", str(tmp_path / "p.npy"), "--layerwise"]) == 0
    predicted = np.load(tmp_path / "p.npy")
    np.testing.assert_array_equal(predicted, reference.argmax(1))
    np.testing.assert_array_equal(predicted, sampled)
    assert main(["embed", "--config", str(config_file), "--out", str(tmp_path / "e.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), reference, rtol=1e-4, atol=1e-4)
    assert main(["embed", "--config", str(config_file), "--out", str(tmp_path / "h.npy"), "--layer", "1"]) == 0
    assert np.load(tmp_path / "h.npy").shape == (300, 8)
