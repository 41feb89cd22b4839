"""The fused attention kernel: gradcheck in float64, and equality with dgl.ops."""
import dgl
import pytest
import torch
import torch.nn.functional as F

import gnnssd  # noqa: F401
from gnnssd.compiler import ops
from gnnssd.compiler.kernels.attention import attention_aggregate


def small_graph():
    src = torch.tensor([0, 1, 2, 3, 4, 0, 0, 5, 5, 2])
    dst = torch.tensor([1, 2, 3, 1, 1, 1, 2, 0, 0, 4])  # multi-edges; 5 has no in-edge
    return dgl.graph((src, dst), num_nodes=6)


def sampled_block():
    gen = torch.Generator().manual_seed(0)
    g = dgl.graph((torch.randint(0, 60, (300,), generator=gen),
                   torch.randint(0, 50, (300,), generator=gen)), num_nodes=60)
    seeds = torch.tensor([0, 2, 4, 6, 55, 58])
    return dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, 6), seeds)


def reference(g, el, er, z, slope):
    score = F.leaky_relu(dgl.ops.u_add_v(g, el, er), slope)
    return dgl.ops.u_mul_e_sum(g, z, dgl.ops.edge_softmax(g, score).unsqueeze(-1))


def inputs(g, heads, feats, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=gen, dtype=dtype, requires_grad=True)  # noqa: E731
    return (make(g.num_src_nodes(), heads), make(g.num_dst_nodes(), heads),
            make(g.num_src_nodes(), heads, feats))


def test_gradcheck_float64():
    g = small_graph()
    el, er, z = inputs(g, 2, 3, torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: attention_aggregate(g, a, b, c, 0.2),
                                    (el, er, z))


def test_gradcheck_float64_block():
    g = sampled_block()
    el, er, z = inputs(g, 3, 2, torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: attention_aggregate(g, a, b, c, 0.1),
                                    (el, er, z))


@pytest.mark.parametrize("graph", [small_graph, sampled_block])
@pytest.mark.parametrize("heads,feats", [(1, 1), (4, 7), (2, 64)])
def test_matches_dgl_ops(graph, heads, feats):
    g = graph()
    el, er, z = inputs(g, heads, feats, torch.float32, seed=heads + feats)
    out = attention_aggregate(g, el, er, z, 0.2)
    ref = reference(g, el, er, z, 0.2)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    weight = torch.randn(out.shape)
    got = torch.autograd.grad((out * weight).sum(), (el, er, z))
    want = torch.autograd.grad((ref * weight).sum(), (el, er, z))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_op_accepts_gat_shapes():
    """The MP-DFG op takes GAT's (nodes, heads, 1) scores and returns (nodes, heads, feats)."""
    g = small_graph()
    el, er, z = inputs(g, 2, 3, torch.float32)
    out = ops.fused_attention(g, el.unsqueeze(-1), er.unsqueeze(-1), z, 0.2)
    torch.testing.assert_close(out, reference(g, el, er, z, 0.2))
