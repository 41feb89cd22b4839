"""The compiler's lowering to CSC blocks (what runs on a GPU without DGL's CUDA build),
checked on the CPU against DGL: every primitive and every built-in layer, forward and
gradients, on random blocks; the Triton aggregation kernel through Triton's interpreter;
Cora trained through the lowered layers as through dgl.nn."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import dgl
import dgl.nn as dglnn
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gnnssd.compiler import CSCBlock, GATConvUDF, GraphConvUDF, SAGEConvUDF, compile as compile_layer, ops
from gnnssd.core import ConfigError
from gnnssd.models.device import check_device

from tests.conftest import REPO

TOL = dict(rtol=1e-4, atol=1e-4)


def random_block(seed: int, num_src: int = 60, num_dst: int = 25, num_edges: int = 400) -> dgl.DGLGraph:
    """A block with repeated edges and destinations without in-edges (the last three)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=gen)
    dst = torch.randint(0, num_dst - 3, (num_edges,), generator=gen)
    return dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=num_dst)


def both(fn, block, *tensors, edge_inputs: tuple[int, ...] = (), edge_output: bool = False):
    """fn on the DGL block and on its CSCBlock: outputs and the inputs' gradients of a
    random projection of the output (the same for both). Edge-valued inputs and outputs are
    in the DGL block's edge order; the CSCBlock's edges are in CSC order (permuted here)."""
    eid = block.adj_tensors("csc")[2]  # CSC position -> DGL edge ID
    back = torch.empty_like(eid)
    back[eid] = torch.arange(len(eid))
    results = []
    for graph in (block, CSCBlock.from_dgl(block)):
        csc = isinstance(graph, CSCBlock)
        leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
        inputs = [leaf[eid] if csc and i in edge_inputs else leaf for i, leaf in enumerate(leaves)]
        out = fn(graph, *inputs)
        out = out[back] if csc and edge_output else out
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad((out * weights).sum(), leaves, allow_unused=True)
        results.append((out.detach(), grads))
    return results


def assert_same(results) -> None:
    (out_dgl, grads_dgl), (out_csc, grads_csc) = results
    torch.testing.assert_close(out_csc, out_dgl, **TOL)
    for g_csc, g_dgl in zip(grads_csc, grads_dgl):
        if g_dgl is None:
            assert g_csc is None or not g_csc.any()
        else:
            torch.testing.assert_close(g_csc, g_dgl, **TOL)


def test_a_csc_block_holds_the_dgl_blocks_edges():
    block = random_block(0)
    csc = CSCBlock.from_dgl(block)
    src, dst = block.edges()
    pairs_dgl = sorted(zip(dst.tolist(), src.tolist()))
    dst_csc = torch.repeat_interleave(torch.arange(csc.num_dst), csc.in_degrees())
    assert sorted(zip(dst_csc.tolist(), csc.indices.tolist())) == pairs_dgl
    torch.testing.assert_close(csc.in_degrees(), block.in_degrees())
    torch.testing.assert_close(csc.out_degrees(), block.out_degrees())
    back = csc.to_dgl()
    assert (back.num_src_nodes(), back.num_dst_nodes(), back.num_edges()) == (60, 25, 400)
    ptr, dst_of, edge = csc.transpose()  # the CSR: each source's out-edges
    for u in range(csc.num_src):
        out_edges = edge[ptr[u]:ptr[u + 1]]
        assert (csc.indices[out_edges] == u).all()
        assert (dst_csc[out_edges] == dst_of[ptr[u]:ptr[u + 1]]).all()


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("shape", [(5,), (3, 4)])
def test_segment_reduce(reduce, shape):
    block = random_block(1)
    e = torch.randn(block.num_edges(), *shape)
    assert_same(both(lambda g, e: ops.segment_reduce(g, e, reduce), block, e, edge_inputs=(0,)))


@pytest.mark.parametrize("op", ["copy_lhs", "copy_rhs", "mul", "add", "sub", "div"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_gspmm(op, reduce):
    block = random_block(2)
    x = torch.randn(block.num_src_nodes(), 3, 4)
    e = torch.rand(block.num_edges(), 3, 1) + 0.5  # broadcast over the last dim, as DGL does
    assert_same(both(lambda g, x, e: ops.gspmm(g, op, reduce, x, e), block, x, e, edge_inputs=(1,)))


@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "dot"])
@pytest.mark.parametrize("targets", [("u", "v"), ("v", "u"), ("u", "e"), ("e", "v")])
def test_gsddmm(op, targets):
    block = random_block(3)
    rows = {"u": block.num_src_nodes(), "v": block.num_dst_nodes(), "e": block.num_edges()}
    x, y = torch.randn(rows[targets[0]], 2, 6), torch.rand(rows[targets[1]], 2, 6) + 0.5
    on_edges = tuple(i for i, target in enumerate(targets) if target == "e")
    assert_same(both(lambda g, x, y: ops.gsddmm(g, op, x, y, *targets), block, x, y, edge_inputs=on_edges,
                     edge_output=True))


def test_gathers_and_edge_softmax():
    block = random_block(4)
    x_src, x_dst = torch.randn(block.num_src_nodes(), 7), torch.randn(block.num_dst_nodes(), 7)
    assert_same(both(ops.gather_src, block, x_src, edge_output=True))
    assert_same(both(ops.gather_dst, block, x_dst, edge_output=True))
    assert_same(both(ops.edge_softmax, block, torch.randn(block.num_edges(), 3) * 4, edge_inputs=(0,),
                     edge_output=True))


def test_fused_attention():
    block = random_block(5)
    el, er = torch.randn(block.num_src_nodes(), 4), torch.randn(block.num_dst_nodes(), 4)
    z = torch.randn(block.num_src_nodes(), 4, 6)
    assert_same(both(lambda g, el, er, z: ops.fused_attention(g, el, er, z, 0.2), block, el, er, z))


def _dgl_twins(seed: int):
    """(dgl.nn layer, its UDF twin with the same parameters, compiled) per built-in layer."""
    torch.manual_seed(seed)
    layers = [dglnn.SAGEConv(12, 8, "mean"), dglnn.GraphConv(12, 8, allow_zero_in_degree=True),
              dglnn.GATConv(12, 5, 3, allow_zero_in_degree=True)]
    twins = [SAGEConvUDF, GraphConvUDF, GATConvUDF]
    return [(layer, compile_layer(udf.from_dgl(layer))) for layer, udf in zip(layers, twins)]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["sage", "gcn", "gat"])
def test_each_built_in_layer_on_a_csc_block_equals_dgl_nn(index):
    block = random_block(6)
    reference, compiled = _dgl_twins(index)[index]
    x = torch.randn(block.num_src_nodes(), 12)
    outputs = []
    for layer, graph in ((reference, block), (compiled, CSCBlock.from_dgl(block))):
        layer.zero_grad()
        inputs = x.clone().requires_grad_(True)
        out = layer(graph, inputs)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        outputs.append((out.detach(), inputs.grad, [p.grad.clone() for p in layer.parameters()]))
    (out_ref, gx_ref, gp_ref), (out_csc, gx_csc, gp_csc) = outputs
    torch.testing.assert_close(out_csc, out_ref, **TOL)
    torch.testing.assert_close(gx_csc, gx_ref, **TOL)
    for a, b in zip(gp_csc, gp_ref):
        torch.testing.assert_close(a, b, **TOL)


def test_a_layer_the_compiler_cannot_capture_is_refused_on_a_csc_block():
    class Opaque(torch.nn.Module):  # asks the graph for something the MP-DFG has no word for
        def forward(self, graph, feat):
            return feat * graph.batch_size

    layer = compile_layer(Opaque())
    with pytest.raises(Exception, match="cannot be lowered without DGL.*batch_size"):
        layer.check_lowerable()
    with pytest.raises(Exception, match="cannot run on a CSCBlock.*batch_size"):
        layer(CSCBlock.from_dgl(random_block(7)), torch.randn(60, 4))


def test_a_model_that_cannot_run_on_a_gpu_is_refused_when_built():
    """A dgl.nn layer, or a compiled layer that does not lower, named before any mini-batch
    (torch.device('cuda') here is only a name: nothing is allocated)."""
    cuda = torch.device("cuda")
    check_device(torch.nn.Sequential(compile_layer(SAGEConvUDF(4, 4))), cuda)  # lowers: accepted
    with pytest.raises(ConfigError, match=r"model layer '0' \(dgl.nn.pytorch.conv.sageconv.SAGEConv\).*CPU-only"):
        check_device(torch.nn.Sequential(dglnn.SAGEConv(4, 4, "mean")), cuda)
    check_device(torch.nn.Sequential(dglnn.SAGEConv(4, 4, "mean")), torch.device("cpu"))


INTERPRETED = textwrap.dedent("""
    import dgl, torch
    from gnnssd.compiler import CSCBlock, ops
    from gnnssd.compiler.kernels.triton_spmm import fused_aggregate
    torch.manual_seed(0)
    src, dst = torch.randint(0, 40, (150,)), torch.randint(0, 17, (150,))
    block = dgl.create_block((src, dst), num_src_nodes=40, num_dst_nodes=20)
    dgl_csc = CSCBlock.from_dgl(block)
    # Triton 2.2's interpreter cannot cast between integer widths: int32 indices here
    csc = CSCBlock(dgl_csc.indptr.int(), dgl_csc.indices.int(), 40, 20)
    eid = block.adj_tensors("csc")[2]
    # no weight, one per edge, one per edge and head (attention's)
    for reduce, weight_shape in [("sum", None), ("mean", None), ("sum", (150, 1)), ("mean", (150, 1)),
                                 ("sum", (150, 2, 1))]:
        x = torch.randn(40, 2, 3, requires_grad=True)
        w = None if weight_shape is None else (torch.rand(weight_shape) + 0.5).requires_grad_(True)
        leaves = [x] if w is None else [x, w]
        out = fused_aggregate(csc, x, None if w is None else w[eid], reduce)  # CSC edge order
        ref = ops.gspmm(block, "copy_lhs" if w is None else "mul", reduce, x, w)
        g = torch.randn(out.shape)
        got = torch.autograd.grad((out * g).sum(), leaves)
        want = torch.autograd.grad((ref * g).sum(), leaves)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    print("checked")
""")


def test_the_triton_aggregation_kernel_in_tritons_interpreter():
    """The GPU kernels' own code, run by Triton's CPU interpreter, against DGL's g-SpMM: sum
    and mean, without weights, with one per edge and one per edge and head, forward and
    both gradients (the weights' through the edge-dot kernel)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", INTERPRETED], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "checked" in run.stdout, run.stderr[-3000:]


def _train_cora(store, blocks_of, model, seed: int) -> float:
    """Train `model` on Cora mini-batches (the same batches and dropout draws for every
    model of one seed) and return its test accuracy."""
    from gnnssd import NodeLoader
    from gnnssd.models.builtin import BlockGNN  # noqa: F401 - model built by the caller

    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    with NodeLoader(store, store.train_idx, fanouts=[10, 10], batch_size=140, features="memory",
                    shuffle=True, seed=seed) as loader:
        test = loader.with_seeds(store.test_idx, fanouts=[-1, -1], batch_size=1000)
        for epoch in range(30):
            loader.set_epoch(epoch)
            model.train()
            for mb in loader:
                loss = F.cross_entropy(model(blocks_of(mb), mb.x), mb.y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        model.eval()
        with torch.no_grad():
            right = sum(int((model(blocks_of(mb), mb.x).argmax(1) == mb.y).sum()) for mb in test)
    return right / len(store.test_idx)


def test_cora_trains_through_the_lowered_layers_as_through_dgl_nn(planetoid_root, tmp_path):
    """Three seeds: a GraphSAGE of dgl.nn layers on DGL blocks, and the same parameters in
    the compiled UDF layers on CSC blocks; test accuracies within 1 point of each other."""
    from gnnssd.datasets import PlanetoidSource
    from gnnssd.models.builtin import BlockGNN
    from gnnssd.storage_format import Store, write_store

    store = Store.open(write_store(tmp_path / "cora", PlanetoidSource(planetoid_root, "cora")))
    accuracies = {"dgl.nn": [], "lowered": []}
    for seed in range(3):
        torch.manual_seed(seed)
        convs = [dglnn.SAGEConv(store.feat_dim, 64, "mean"), dglnn.SAGEConv(64, 7, "mean")]
        lowered = BlockGNN([compile_layer(SAGEConvUDF.from_dgl(c)) for c in convs], 0.5)
        reference = BlockGNN(convs, 0.5)
        accuracies["dgl.nn"].append(_train_cora(store, lambda mb: mb.blocks, reference, seed))
        accuracies["lowered"].append(_train_cora(store, lambda mb: mb.csc_blocks, lowered, seed))
    assert min(accuracies["dgl.nn"]) > 0.7, accuracies
    assert abs(np.mean(accuracies["lowered"]) - np.mean(accuracies["dgl.nn"])) <= 0.01, accuracies
