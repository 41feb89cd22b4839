"""On a GPU (`pytest -m cuda`; skipped without one): the lowered layers and the Triton
kernel against the CPU reference, the mini-batch's copy, and training end to end."""
from __future__ import annotations

import pytest
import torch

from gnnssd.compiler import CSCBlock
from gnnssd.core import ConfigError
from gnnssd.models.device import check_device

from tests.compiler.test_compiler_csc import _dgl_twins, random_block

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")]
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("index", [0, 1, 2], ids=["sage", "gcn", "gat"])
def test_each_built_in_layer_on_the_gpu_equals_dgl_nn_on_the_cpu(index):
    block = random_block(10, num_src=3000, num_dst=1000, num_edges=40000)
    reference, compiled = _dgl_twins(index)[index]
    x = torch.randn(block.num_src_nodes(), 12)
    out_ref = reference(block, x.requires_grad_(True))
    grad = torch.randn(out_ref.shape)
    (out_ref * grad).sum().backward()
    compiled = compiled.cuda()
    x_gpu = x.detach().cuda().requires_grad_(True)
    out = compiled(CSCBlock.from_dgl(block).to("cuda"), x_gpu)
    (out * grad.cuda()).sum().backward()
    torch.testing.assert_close(out.cpu(), out_ref.detach(), **TOL)
    torch.testing.assert_close(x_gpu.grad.cpu(), x.grad, **TOL)
    for (name, p), p_ref in zip(compiled.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, **TOL, msg=name)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_fused_kernel_equals_torch_ops(reduce, dtype):
    from gnnssd.compiler.kernels import csc
    from gnnssd.compiler.kernels.triton_spmm import fused_aggregate

    block = CSCBlock.from_dgl(random_block(11, num_src=50000, num_dst=20000, num_edges=600000)).to("cuda")
    x = torch.randn(block.num_src, 200, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.rand(block.num_edges, 1, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(block.num_dst, 200, device="cuda", dtype=dtype)
    results = []
    for fused in (True, False):
        out = (fused_aggregate(block, x, w, reduce) if fused else
               csc.segment_reduce(block, csc.gather_src(block, x.float()) * w.float(), reduce))
        results.append([out.float(), *torch.autograd.grad((out.float() * grad.float()).sum(), [x, w])])
    tol = TOL if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for got, want in zip(*results):
        torch.testing.assert_close(got.float(), want.float(), **tol)


def test_a_minibatch_reaches_the_gpu_whole_and_widened(tmp_path):
    from gnnssd.loading import MiniBatch

    block = random_block(12)
    x = torch.randn(block.num_src_nodes(), 8).half()
    mb = MiniBatch(torch.arange(60), torch.arange(25), [block], x, torch.arange(25))
    moved = mb.to("cuda")
    assert moved.x.dtype == torch.float32 and moved.x.is_cuda
    torch.testing.assert_close(moved.x.cpu(), x.float())
    torch.testing.assert_close(moved.y.cpu(), mb.y)
    host = CSCBlock.from_dgl(block)
    assert moved.model_blocks[0].indptr.is_cuda
    torch.testing.assert_close(moved.model_blocks[0].indptr.cpu(), host.indptr)
    torch.testing.assert_close(moved.model_blocks[0].indices.cpu(), host.indices)


def test_a_dgl_nn_model_is_refused_on_the_gpu_when_dgl_has_no_cuda():
    import dgl.nn as dglnn

    from gnnssd.core import dgl_has_cuda

    if dgl_has_cuda():
        pytest.skip("this DGL has CUDA: dgl.nn runs on the GPU")
    with pytest.raises(ConfigError, match="CPU-only"):
        check_device(torch.nn.Sequential(dglnn.GraphConv(4, 4)), torch.device("cuda"))


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_training_on_the_gpu_learns(tmp_path, features):
    from gnnssd.core.config import config_from_dict
    from gnnssd.datasets import synthetic_source
    from gnnssd.storage_format import write_store
    from gnnssd.training import Trainer

    store = write_store(tmp_path / "store", synthetic_source("tiny"))
    config = config_from_dict({"store": str(store), "run_dir": str(tmp_path / "run"), "seed": 0, "device": "cuda",
                               "features": features, "model": {"name": "sage", "hidden": 32, "layers": 2},
                               "sampler": {"fanouts": [5, 5], "batch_size": 256},
                               "train": {"epochs": 4, "lr": 0.01, "progress": False}})
    trainer = Trainer(config)
    assert trainer.device.type == "cuda"
    history = trainer.fit()
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert trainer.evaluate("test")["accuracy"] > 0.4  # 8 classes: chance is 0.125


def test_ssd_minibatches_on_the_gpu_equal_the_cpus_and_the_stores_rows(tmp_path):
    """The pinned, recycled x of the ssd loader and the copy stream deliver what the same
    loader gives on the CPU, and x holds the store's rows of input_nodes (read by NumPy)."""
    import numpy as np

    from gnnssd import NodeLoader
    from gnnssd.datasets import synthetic_source
    from gnnssd.storage_format import Store, write_store

    store = Store.open(write_store(tmp_path / "store", synthetic_source("tiny")))
    options = dict(fanouts=[5, 5], batch_size=64, shuffle=True, seed=3, features="ssd", memory_budget="32MiB")
    with NodeLoader(store, store.train_idx, device="cpu", **options) as reference, \
            NodeLoader(store, store.train_idx, device="cuda", **options) as ssd:
        pairs = list(zip(reference, ssd))
    assert len(pairs) > 3
    for want, got in pairs:
        assert got.x.is_cuda and got.model_blocks[0].indptr.is_cuda
        torch.testing.assert_close(got.input_nodes.cpu(), want.input_nodes)
        torch.testing.assert_close(got.x.cpu(), want.x)
        torch.testing.assert_close(got.y.cpu(), want.y)
        rows = np.asarray(store.node_features(want.input_nodes.numpy()), np.float32)
        torch.testing.assert_close(got.x.cpu(), torch.from_numpy(rows))
