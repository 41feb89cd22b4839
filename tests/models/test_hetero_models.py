"""R-GCN / R-GAT on heterogeneous blocks: against dgl.nn convolutions applied by hand, a task
only the relations can solve, and the trainer end to end (memory and ssd)."""
from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gnnssd.core.config import ConfigError, ModelConfig, config_from_dict
from gnnssd.models.hetero import build_hetero_model
from gnnssd.storage_format import Store, write_store
from gnnssd.training.tasks import Trainer
from tests.hetero_graph import ToyHeteroSource


@pytest.fixture(scope="module")
def toy():
    source = ToyHeteroSource()
    return source, source.dgl_graph()


def _blocks(graph, seeds, layers=2):
    _, _, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(layers).sample_blocks(
        graph, {"paper": torch.as_tensor(seeds)})
    return blocks


def _x(source, block):
    return {"paper": torch.from_numpy(source.features[block.srcnodes["paper"].data[dgl.NID].numpy()])}


def test_rgcn_layer_is_a_mean_per_relation_summed_plus_a_self_loop(toy):
    """As DGL's hetero_rgcn example: sum over relations r into v of the mean of W_r h_u over
    v's in-neighbours u in r, plus the type's self-loop map of h_v; by hand with index_add."""
    source, graph = toy
    model = build_hetero_model(ModelConfig(name="rgcn", hidden=16, layers=2, dropout=0.0),
                               source.schema, source.feat_dim, 4).eval()
    block = _blocks(graph, np.arange(20), layers=2)[0]
    h = model.inputs(block, _x(source, block))
    got = model.layer(0, block, h)
    for dst_type in ("paper", "author", "institution"):
        count = block.num_dst_nodes(dst_type)
        expected = model.loops[0][dst_type](h[dst_type][:count])
        for src, rel, dst in block.canonical_etypes:
            if dst != dst_type or block.num_edges(rel) == 0:
                continue
            u, v = block.edges(etype=(src, rel, dst))
            total = torch.zeros(count, 16).index_add_(0, v, h[src][u] @ model.convs[0].mods[rel].weight)
            degree = torch.zeros(count).index_add_(0, v, torch.ones(len(v))).clamp(min=1)
            expected = expected + total / degree[:, None]
        torch.testing.assert_close(got[dst_type], torch.relu(expected))


def test_learned_embeddings_start_xavier_uniform(toy):
    source, _ = toy
    model = build_hetero_model(ModelConfig(name="rgcn", hidden=8, layers=2, featureless="embedding"),
                               source.schema, source.feat_dim, 4)
    weight = model.embeddings["author"].weight
    bound = (6 / (weight.shape[0] + weight.shape[1])) ** 0.5
    assert weight.abs().max() <= bound and weight.abs().max() > 0.9 * bound


def test_featureless_types_are_zeros_or_a_learned_embedding(toy):
    source, graph = toy
    zeros = build_hetero_model(ModelConfig(name="rgcn", hidden=8, layers=2, featureless="zeros"),
                               source.schema, source.feat_dim, 4)
    embedded = build_hetero_model(ModelConfig(name="rgcn", hidden=8, layers=2),  # the default
                                  source.schema, source.feat_dim, 4)
    assert not any("embeddings" in n for n, _ in zeros.named_parameters())
    extra = sum(p.numel() for p in embedded.parameters()) - sum(p.numel() for p in zeros.parameters())
    assert extra == (200 + 20) * source.feat_dim
    blocks = _blocks(graph, np.arange(10))
    h = zeros.inputs(blocks[0], _x(source, blocks[0]))
    assert not h["author"].any() and h["author"].shape == (blocks[0].num_src_nodes("author"), source.feat_dim)
    embedded(blocks, _x(source, blocks[0])).sum().backward()
    assert embedded.embeddings["author"].weight.grad.abs().sum() > 0


def test_relations_carry_a_label_features_do_not(toy):
    """Paper label = its authors' institution class; paper features are noise: R-GCN with
    three layers (paper <- author <- institution) learns it, the MLP cannot."""
    source, graph = toy
    rng = np.random.default_rng(0)
    institution_class = rng.integers(0, 2, 20)
    author_inst = graph.edges(etype="affiliated_with")
    author_class = np.zeros(200, np.int64)
    author_class[author_inst[0].numpy()] = institution_class[author_inst[1].numpy()]
    writes = graph.edges(etype="writes")
    label = np.zeros(300, np.int64)
    label[writes[1].numpy()] = author_class[writes[0].numpy()]  # some author's class
    torch.manual_seed(0)
    scores = {}
    for name, layers in (("rgcn", 3), ("mlp", 1)):
        model = build_hetero_model(ModelConfig(name=name, hidden=32, layers=layers, dropout=0.0),
                                   source.schema, source.feat_dim, 2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        blocks = _blocks(graph, np.arange(300), layers=3)
        x, y = _x(source, blocks[0]), torch.from_numpy(label)
        for _ in range(150):
            loss = F.cross_entropy(model(blocks, x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scores[name] = float((model(blocks, x).argmax(1) == y).float().mean())
    assert scores["rgcn"] > 0.9 > scores["mlp"] + 0.15, scores


def test_rgat_trains_and_a_type_without_destinations_is_fine(toy):
    source, graph = toy
    model = build_hetero_model(ModelConfig(name="rgat", hidden=16, heads=4, layers=2), source.schema,
                               source.feat_dim, 4)
    blocks = _blocks(graph, np.arange(5))
    assert blocks[-1].num_dst_nodes("author") == 0
    out = model(blocks, _x(source, blocks[0]))
    assert out.shape == (5, 4)
    out.sum().backward()


def test_homogeneous_models_are_refused_on_a_typed_store_and_back(toy):
    source, _ = toy
    with pytest.raises(ConfigError, match="model.name: 'sage' is a homogeneous model; this store is heterogeneous"):
        build_hetero_model(ModelConfig(name="sage"), source.schema, source.feat_dim, 4)
    from gnnssd.models.builtin import build_model
    with pytest.raises(ConfigError, match="'rgcn' is a relational GNN for heterogeneous stores"):
        build_model(ModelConfig(name="rgcn"), 8, 4)


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_trainer_fits_evaluates_and_predicts_on_a_typed_store(tmp_path, features):
    source = ToyHeteroSource(papers=2000, authors=1500, institutions=40, feat_dim=64)
    store = write_store(tmp_path / "store", source)
    config = config_from_dict({"store": str(store), "run_dir": str(tmp_path / "run"), "features": features,
                               "model": {"name": "rgcn", "hidden": 16, "layers": 2},
                               "sampler": {"fanouts": [{"cites": 5, "writes": 3, "written_by": 3,
                                                        "employs": 2, "affiliated_with": 1}, 5],
                                           "batch_size": 256},
                               "train": {"epochs": 2, "progress": False},
                               "ssd": {"memory_budget": "16MiB", "hot_fraction": 0.2}})
    trainer = Trainer(config)
    try:
        history = trainer.fit()
        assert len(history) == 2 and all(np.isfinite(r["train_loss"]) for r in history)
        scores = trainer.evaluate("test")
        assert scores["nodes"] == len(Store.open(store).test_idx)
        predicted = trainer.predict()
        assert predicted.shape == (2000,) and predicted.min() >= 0 and predicted.max() < 4
        np.testing.assert_array_equal(trainer.predict(np.array([7, 3])), predicted[[7, 3]])
    finally:
        trainer.close()
