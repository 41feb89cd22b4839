"""float16 x widened inside the built-in models: the same outputs and gradients as float32 x,
without the float32 copy alive through the backward pass."""
from __future__ import annotations

import gc
import weakref

import dgl
import pytest
import torch

from gnnssd.core.config import ModelConfig, config_from_dict
from gnnssd.datasets import synthetic_source
from gnnssd.models import store_model
from gnnssd.models.builtin import build_model
from gnnssd.models.hetero import build_hetero_model
from gnnssd.models.widen import widened
from gnnssd.sampler import node_order
from gnnssd.storage_format import Store, write_store
from gnnssd.training.tasks import Trainer
from tests.hetero_graph import ToyHeteroSource


def _half(shape, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).half()


def test_a_linear_on_widened_rows_saves_float16_and_gives_float32s_gradients():
    """The float32 copy dies with the block; outside it (a plain widening) the Linear's saved
    input keeps it alive until the backward pass."""
    x16 = _half((1000, 16))
    reference = torch.nn.Linear(16, 4)
    linear = torch.nn.Linear(16, 4)
    linear.load_state_dict(reference.state_dict())

    with widened(x16) as x:
        wide = weakref.ref(x)
        out = linear(x[:600]).square().sum()
        del x
    gc.collect()
    assert wide() is None

    x32 = x16.float()
    plain = weakref.ref(x32)
    expected = reference(x32[:600]).square().sum()
    del x32
    gc.collect()
    assert plain() is not None  # what widened() avoids

    out.backward()
    expected.backward()
    assert torch.equal(out, expected)
    assert torch.equal(linear.weight.grad, reference.weight.grad)
    assert torch.equal(linear.bias.grad, reference.bias.grad)


def test_widened_passes_float32_and_integer_tensors_as_they_are():
    x, ids = torch.randn(5, 3), torch.arange(5)
    with widened(x) as same:
        assert same is x
    with widened({"paper": x, "ids": ids, "author": _half((4, 3))}) as h:
        assert h["paper"] is x and h["ids"] is ids and h["author"].dtype == torch.float32


def _step(model, blocks, x):
    model.zero_grad()
    out = model(blocks, x)
    out.square().mean().backward()
    return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _same_step(model, blocks, x16):
    out16, grads16 = _step(model, blocks, x16)
    out32, grads32 = _step(model, blocks, {k: v.float() for k, v in x16.items()} if isinstance(x16, dict)
                           else x16.float())
    assert torch.equal(out16, out32)
    assert grads16.keys() == grads32.keys() and grads16
    for name, grad in grads16.items():
        assert torch.equal(grad, grads32[name]), name


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("name", ["sage", "gcn", "gat", "mlp"])
def test_each_builtin_model_gives_the_same_outputs_and_gradients_on_float16_x(name, compiled):
    torch.manual_seed(0)
    graph = dgl.rand_graph(400, 3000)
    sampler = dgl.dataloading.MultiLayerNeighborSampler([5, 5])
    input_nodes, _, blocks = sampler.sample_blocks(graph, torch.arange(0, 400, 7))
    torch.manual_seed(1)
    model = build_model(ModelConfig(name=name, hidden=16, layers=2, dropout=0.0, compile=compiled), 12, 5)
    _same_step(model, blocks, _half((len(input_nodes), 12)))


@pytest.mark.parametrize("name", ["rgcn", "rgat", "mlp"])
def test_each_relational_model_gives_the_same_outputs_and_gradients_on_float16_x(name):
    source = ToyHeteroSource()
    graph = source.dgl_graph()
    _, _, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(2).sample_blocks(
        graph, {"paper": torch.arange(20)})
    torch.manual_seed(0)
    model = build_hetero_model(ModelConfig(name=name, hidden=16, layers=2, dropout=0.0),
                               source.schema, source.feat_dim, 4)
    ids = blocks[0].srcnodes["paper"].data[dgl.NID].numpy()
    x16 = {"paper": torch.from_numpy(source.features[ids]).half()}
    _same_step(model, blocks, x16)


@pytest.fixture(scope="module")
def half_store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("half") / "store", synthetic_source("tiny"),
                       order=node_order("degree"), dtype="float16")


def test_the_trainer_feeds_its_builtin_model_float16_x_and_trains_as_with_float32(half_store, tmp_path):
    """The built-in model gets the ssd loader's float16 x; the same model handed in by the
    user gets float32 x (its own layers may not widen): the same losses and scores."""
    def config(run):
        return config_from_dict({
            "store": str(half_store), "run_dir": str(tmp_path / run), "seed": 7, "features": "ssd",
            "model": {"name": "sage", "hidden": 32, "layers": 2},
            "sampler": {"fanouts": [5, 5], "batch_size": 256},
            "train": {"epochs": 2, "lr": 0.01, "progress": False}, "deterministic": True,
            "ssd": {"memory_budget": "16MiB"}})

    builtin = Trainer(config("builtin"))
    torch.manual_seed(7)
    user = Trainer(config("user"), model=store_model(config("user").model, Store.open(half_store), 8))
    user.model.load_state_dict(builtin.model.state_dict())
    dtypes = {"builtin": set(), "user": set()}
    for name, trainer in (("builtin", builtin), ("user", user)):
        trainer.model.register_forward_pre_hook(lambda module, args, seen=dtypes[name]: seen.add(args[1].dtype))
    try:
        got, expected = builtin.fit(), user.fit()
        assert dtypes == {"builtin": {torch.float16}, "user": {torch.float32}}
        assert [r["train_loss"] for r in got] == [r["train_loss"] for r in expected]
        assert [r["valid_acc"] for r in got] == [r["valid_acc"] for r in expected]
        assert builtin.evaluate("test") == user.evaluate("test")
        assert got[-1]["train_loss"] < got[0]["train_loss"]
    finally:
        builtin.close()
        user.close()
