"""R-GCN and R-GAT through the compiler (gnnssd.compiler.hetero): each relational layer and
the whole built-in models against dgl.nn's HeteroGraphConv, forward and gradients, on random
typed blocks and on blocks sampled from a `mag-small` store, on DGL blocks and on their
per-relation CSC (TypedCSCBlock, what runs on a GPU without DGL's CUDA build); training
R-GCN on mag-small through the CSC path as through dgl.nn; on a GPU (`pytest -m cuda`) the
same layers against the CPU."""
from __future__ import annotations

import dgl
import dgl.nn as dglnn
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gnnssd.compiler import (CompiledLayer, GATConvUDF, GraphConvUDF, HeteroGraphConvCompiled, TypedCSCBlock,
                             compile as compile_layer)
from gnnssd.core import ConfigError, ModelConfig
from gnnssd.models.device import check_device
from gnnssd.models.hetero import build_hetero_model

TOL = dict(rtol=1e-4, atol=1e-4)
#: Input width of each node type (layer 0 of a store whose featured types differ in width).
WIDTHS = {"paper": 6, "author": 5, "institution": 5, "topic": 5}
COUNTS = {"paper": (40, 15), "author": (30, 12), "institution": (8, 5), "topic": (6, 4)}  # (sources, destinations)
#: Relation -> edges; `about` has none in the block, so `topic` gets no message at all.
RELATIONS = {("paper", "cites", "paper"): 120, ("author", "writes", "paper"): 90,
             ("paper", "written_by", "author"): 90, ("author", "affiliated_with", "institution"): 20,
             ("institution", "employs", "author"): 20, ("paper", "about", "topic"): 0}


def random_typed_block(seed: int) -> dgl.DGLGraph:
    """A typed block with repeated edges, destinations without in-edges (each type's last
    two) and a relation without edges."""
    gen = torch.Generator().manual_seed(seed)
    edges = {}
    for (src, rel, dst), count in RELATIONS.items():
        edges[(src, rel, dst)] = (torch.randint(0, COUNTS[src][0], (count,), generator=gen),
                                  torch.randint(0, COUNTS[dst][1] - 2, (count,), generator=gen))
    return dgl.create_block(edges, num_src_nodes={t: c[0] for t, c in COUNTS.items()},
                            num_dst_nodes={t: c[1] for t, c in COUNTS.items()})


def hetero_twins(name: str, out: int = 4, heads: int = 2) -> tuple[nn.Module, HeteroGraphConvCompiled]:
    """dgl.nn's HeteroGraphConv of R-GCN's or R-GAT's relation layers (as gnnssd.models.hetero
    builds them) and its compiled twin, built from the same state dict."""
    def relation(src: str, dst: str, compiled: bool):
        d_in = WIDTHS[src] if WIDTHS[src] == WIDTHS[dst] else (WIDTHS[src], WIDTHS[dst])
        if name == "rgcn":
            return (compile_layer(GraphConvUDF(WIDTHS[src], out, norm="right", bias=False)) if compiled else
                    dglnn.GraphConv(WIDTHS[src], out, norm="right", bias=False, allow_zero_in_degree=True))
        return (compile_layer(GATConvUDF(d_in, out, heads, bias=False)) if compiled else
                dglnn.GATConv(d_in, out, heads, bias=False, allow_zero_in_degree=True))

    reference = dglnn.HeteroGraphConv({rel: relation(s, d, False) for s, rel, d in RELATIONS}, aggregate="sum")
    compiled = HeteroGraphConvCompiled({rel: relation(s, d, True) for s, rel, d in RELATIONS})
    compiled.load_state_dict(reference.state_dict(), strict=True)
    return reference, compiled


def run_with_grads(module, block, h: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]):
    """module(block, h) per type (a type nothing reached: zeros, as RelationalGNN fills it),
    and the gradients of sum(out * grads) with respect to h and the parameters."""
    leaves = {t: x.detach().clone().requires_grad_(True) for t, x in h.items()}
    module.zero_grad()
    out = module(block, leaves)
    full = {t: out[t] if t in out else torch.zeros_like(grads[t]) for t in grads}
    sum((full[t] * grads[t]).sum() for t in grads if t in out).backward()
    def grad(t: torch.Tensor) -> torch.Tensor:  # an input no edge read: zero
        return torch.zeros_like(t) if t.grad is None else t.grad.clone()

    return ({t: v.detach() for t, v in full.items()}, {t: grad(x) for t, x in leaves.items()},
            {n: grad(p) for n, p in module.named_parameters()})


def assert_same(got, expected) -> None:
    for part_got, part_expected in zip(got, expected):
        assert part_got.keys() == part_expected.keys()
        for key in part_expected:
            torch.testing.assert_close(part_got[key], part_expected[key], **TOL, msg=str(key))


@pytest.mark.parametrize("name", ["rgcn", "rgat"])
def test_each_relational_layer_equals_hetero_graph_conv_on_random_typed_blocks(name):
    """Forward and gradients (inputs and every parameter) on the DGL block and on its
    TypedCSCBlock; the relation without edges and the type it alone reaches included."""
    for seed in range(3):
        torch.manual_seed(seed)
        block = random_typed_block(seed)
        reference, compiled = hetero_twins(name)
        h = {t: torch.randn(COUNTS[t][0], WIDTHS[t]) for t in COUNTS}
        shape = (4,) if name == "rgcn" else (2, 4)
        grads = {t: torch.randn(COUNTS[t][1], *shape) for t in COUNTS}
        expected = run_with_grads(reference, block, h, grads)
        assert not expected[0]["topic"].any()  # no edge reaches it: zeros from dgl.nn too
        for graph in (block, TypedCSCBlock.from_dgl(block)):
            assert_same(run_with_grads(compiled, graph, h, grads), expected)


def test_a_typed_csc_block_holds_each_relations_edges():
    block = random_typed_block(0)
    typed = TypedCSCBlock.from_dgl(block)
    assert typed.canonical_etypes == block.canonical_etypes
    for relation in block.canonical_etypes:
        csc = typed[relation]
        assert (csc.num_src, csc.num_dst) == (block.num_src_nodes(relation[0]), block.num_dst_nodes(relation[2]))
        u, v = block.edges(etype=relation)
        got = sorted(zip(csc.indices.tolist(), csc.dst_index().tolist()))
        assert got == sorted(zip(u.tolist(), v.tolist()))
    assert {t: typed.num_dst_nodes(t) for t in COUNTS} == {t: c[1] for t, c in COUNTS.items()}


@pytest.fixture(scope="module")
def mag_small(tmp_path_factory):
    """A mag-small store, scaled down (3000 papers): three relations and their reverses,
    featureless authors and institutions."""
    from gnnssd.datasets import hetero_synthetic_source
    from gnnssd.storage_format import Store, write_store

    source = hetero_synthetic_source("mag-small", papers=3000, authors=3000, institutions=60)
    return Store.open(write_store(tmp_path_factory.mktemp("mag") / "store", source))


def _sampled(store, batch_size: int = 256, batches: int = 2):
    from gnnssd import NodeLoader

    with NodeLoader(store, store.train_idx, fanouts=[8, 6], batch_size=batch_size, features="memory",
                    shuffle=True, seed=0) as loader:
        return [mb for _, mb in zip(range(batches), loader)]


def _twin_models(store, name: str, seed: int, **model):
    """The built-in model with dgl.nn's layers and with compiled ones, same parameters."""
    torch.manual_seed(seed)
    cfg = {"name": name, "hidden": 16, "layers": 2, "heads": 2, "dropout": 0.0, **model}
    reference = build_hetero_model(ModelConfig(**cfg, compile=False), store.schema, store.feat_dim, store.num_classes)
    compiled = build_hetero_model(ModelConfig(**cfg), store.schema, store.feat_dim, store.num_classes)
    assert {k: v.shape for k, v in compiled.state_dict().items()} == \
        {k: v.shape for k, v in reference.state_dict().items()}  # checkpoints load either way
    compiled.load_state_dict(reference.state_dict(), strict=True)
    return reference, compiled


@pytest.mark.parametrize("name", ["rgcn", "rgat"])
def test_the_whole_model_equals_dgl_nn_on_blocks_sampled_from_mag_small(mag_small, name):
    """Logits and every parameter's gradient (the authors' and institutions' embeddings too),
    compiled on DGL blocks and on the mini-batch's TypedCSCBlocks, against dgl.nn's model."""
    for mb in _sampled(mag_small):
        reference, compiled = _twin_models(mag_small, name, seed=1)
        grad = torch.randn(len(mb.y), mag_small.num_classes) / len(mb.y)  # a mean loss's scale
        results = []
        for model, blocks in ((reference, mb.blocks), (compiled, mb.blocks), (compiled, mb.csc_blocks)):
            model.zero_grad()
            out = model(blocks, mb.x)
            (out * grad).sum().backward()
            results.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                           if p.grad is not None}))
        assert all(isinstance(b, TypedCSCBlock) for b in mb.csc_blocks)
        (out_ref, grads_ref), *others = results
        assert grads_ref.keys() >= {"embeddings.author.weight", "convs.0.mods.writes." +
                                    ("weight" if name == "rgcn" else "fc.weight")}
        for out, grads in others:
            torch.testing.assert_close(out, out_ref, **TOL)
            assert grads.keys() == grads_ref.keys()
            for key, value in grads_ref.items():
                torch.testing.assert_close(grads[key], value, **TOL, msg=key)


def test_rgcn_trains_on_mag_small_through_the_csc_path_as_through_dgl_nn(mag_small):
    """Two seeds, the same mini-batches and dropout draws for both: dgl.nn's R-GCN on DGL's
    blocks, the compiled one on TypedCSCBlocks; test accuracies within a point of each other
    and far above chance (16 classes)."""
    from gnnssd import NodeLoader

    accuracies = {"dgl.nn": [], "compiled": []}
    for seed in range(2):
        models = dict(zip(accuracies, _twin_models(mag_small, "rgcn", seed, dropout=0.5)))
        optimizers = {k: torch.optim.Adam(m.parameters(), lr=0.01) for k, m in models.items()}
        blocks_of = {"dgl.nn": lambda mb: mb.blocks, "compiled": lambda mb: mb.csc_blocks}
        with NodeLoader(mag_small, mag_small.train_idx, fanouts=[5, 5], batch_size=256, features="memory",
                        shuffle=True, seed=seed) as loader:
            test = loader.with_seeds(mag_small.test_idx, fanouts=[8, 8], batch_size=1000)
            for epoch in range(3):
                loader.set_epoch(epoch)
                for step, mb in enumerate(loader):
                    for key, model in models.items():
                        model.train()
                        torch.manual_seed(1000 * epoch + step)  # the same dropout masks for both
                        loss = F.cross_entropy(model(blocks_of[key](mb), mb.x), mb.y)
                        optimizers[key].zero_grad()
                        loss.backward()
                        optimizers[key].step()
            right = dict.fromkeys(models, 0)
            with torch.no_grad():
                for mb in test:
                    for key, model in models.items():
                        right[key] += int((model.eval()(blocks_of[key](mb), mb.x).argmax(1) == mb.y).sum())
        for key in models:
            accuracies[key].append(right[key] / len(mag_small.test_idx))
    assert min(accuracies["dgl.nn"]) > 0.3, accuracies
    assert abs(np.mean(accuracies["compiled"]) - np.mean(accuracies["dgl.nn"])) <= 0.01, accuracies


def test_compiled_rgcn_and_rgat_may_run_on_a_gpu_dgl_nn_ones_are_refused_naming_the_layer():
    """(torch.device('cuda') here is only a name: nothing is allocated.)"""
    from tests.hetero_graph import ToyHeteroSource

    source, cuda = ToyHeteroSource(), torch.device("cuda")
    for name in ("rgcn", "rgat"):
        model = build_hetero_model(ModelConfig(name=name), source.schema, source.feat_dim, 4)
        assert all(isinstance(m, CompiledLayer) for m in model.convs[0].mods.values())
        check_device(model, cuda)
        with pytest.raises(ConfigError, match=r"model layer 'convs.0' \(dgl.nn.pytorch.hetero.HeteroGraphConv\)"):
            check_device(build_hetero_model(ModelConfig(name=name, compile=False), source.schema,
                                            source.feat_dim, 4), cuda)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("name", ["rgcn", "rgat"])
def test_each_relational_layer_on_the_gpu_equals_hetero_graph_conv_on_the_cpu(name):
    torch.manual_seed(0)
    block = random_typed_block(5)
    reference, compiled = hetero_twins(name)
    h = {t: torch.randn(COUNTS[t][0], WIDTHS[t]) for t in COUNTS}
    grads = {t: torch.randn(COUNTS[t][1], *((4,) if name == "rgcn" else (2, 4))) for t in COUNTS}
    expected = run_with_grads(reference, block, h, grads)
    got = run_with_grads(compiled.cuda(), TypedCSCBlock.from_dgl(block).to("cuda"),
                         {t: x.cuda() for t, x in h.items()}, {t: g.cuda() for t, g in grads.items()})
    assert_same([{k: v.cpu() for k, v in part.items()} for part in got], expected)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("name,features", [("rgcn", "memory"), ("rgcn", "ssd"), ("rgat", "memory")])
def test_relational_models_train_on_the_gpu_without_dgls_cuda_build(tmp_path, name, features):
    """`device: cuda`: the trainer keeps the GPU (with PyPI's DGL: the compiled relational
    layers on the mini-batches' TypedCSCBlocks) and learns."""
    from gnnssd.core.config import config_from_dict
    from gnnssd.storage_format import write_store
    from gnnssd.training.tasks import Trainer
    from tests.hetero_graph import ToyHeteroSource

    store = write_store(tmp_path / "store", ToyHeteroSource(papers=2000, authors=1500, institutions=40, feat_dim=64))
    config = config_from_dict({"store": str(store), "run_dir": str(tmp_path / "run"), "seed": 0, "device": "cuda",
                               "features": features, "model": {"name": name, "hidden": 16, "layers": 2},
                               "sampler": {"fanouts": [5, 5], "batch_size": 256},
                               "train": {"epochs": 3, "lr": 0.01, "progress": False},
                               "ssd": {"memory_budget": "16MiB", "hot_fraction": 0.2}})
    trainer = Trainer(config)
    try:
        assert trainer.device.type == "cuda"  # with PyPI's DGL only TypedCSCBlocks can carry the graph there
        history = trainer.fit()
        assert all(np.isfinite(r["train_loss"]) for r in history)
        assert history[-1]["train_loss"] < history[0]["train_loss"]
    finally:
        trainer.close()
