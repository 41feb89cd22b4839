"""Compiled layers equal their UDF execution through DGL (forward and gradients).

Also home of two layers the built-ins do not cover (an edge-gated layer with a
concatenated projection, and a GATv2-style score) and one written with DGL builtins.
"""
import dgl
import dgl.function as fn
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch.nn.functional as F
from dgl.utils import expand_as_pair
from torch import nn

import gnnssd  # noqa: F401  (sets the DGL backend)
from gnnssd.compiler import GATConvUDF, GraphConvUDF, SAGEConvUDF, compile
from gnnssd.compiler.annotate import Space
from gnnssd.compiler import ops


class GatedEdgeUDF(nn.Module):
    """Edge-gated aggregation: gate = sigmoid(W [h_u || h_v]), out = sum(gate*V h_u)/sum(gate)."""

    def __init__(self, in_feats: int, out_feats: int):
        super().__init__()
        self.gate = nn.Linear(2 * in_feats, out_feats)
        self.value = nn.Linear(in_feats, out_feats)

    def message(self, edges):
        gate = torch.sigmoid(self.gate(torch.cat([edges.src["h"], edges.dst["h"]], dim=-1)))
        return {"m": gate * self.value(edges.src["h"]), "g": gate}

    def reduce(self, nodes):
        return {"out": nodes.mailbox["m"].sum(1) / (nodes.mailbox["g"].sum(1) + 1e-6)}

    def forward(self, graph, feat):
        with graph.local_scope():
            graph.srcdata["h"], graph.dstdata["h"] = expand_as_pair(feat, graph)
            graph.update_all(self.message, self.reduce)
            return graph.dstdata["out"]


class GATv2UDF(nn.Module):
    """GATv2 score: a . leaky_relu(W_s h_u + W_d h_v), softmax per destination."""

    def __init__(self, in_feats: int, out_feats: int, num_heads: int = 2):
        super().__init__()
        self.heads, self.out = num_heads, out_feats
        self.fc_src = nn.Linear(in_feats, out_feats * num_heads)
        self.fc_dst = nn.Linear(in_feats, out_feats * num_heads)
        self.attn = nn.Parameter(torch.randn(1, num_heads, out_feats))

    def message(self, edges):
        zs = self.fc_src(edges.src["h"]).view(-1, self.heads, self.out)
        zd = self.fc_dst(edges.dst["h"]).view(-1, self.heads, self.out)
        score = (F.leaky_relu(zs + zd, 0.2) * self.attn).sum(-1, keepdim=True)
        return {"z": zs, "e": score}

    def reduce(self, nodes):
        alpha = F.softmax(nodes.mailbox["e"], dim=1)
        return {"out": (alpha * nodes.mailbox["z"]).sum(1)}

    def forward(self, graph, feat):
        with graph.local_scope():
            graph.srcdata["h"], graph.dstdata["h"] = expand_as_pair(feat, graph)
            graph.update_all(self.message, self.reduce)
            return F.elu(graph.dstdata["out"])


class WeightedMaxBuiltin(nn.Module):
    """DGL builtins and an edge feature read from the graph: max_u (W h_u) * w_uv."""

    def __init__(self, in_feats: int, out_feats: int):
        super().__init__()
        self.fc = nn.Linear(in_feats, out_feats)

    def forward(self, graph, feat):
        with graph.local_scope():
            graph.srcdata["h"] = self.fc(expand_as_pair(feat, graph)[0])
            graph.update_all(fn.u_mul_e("h", "w", "m"), fn.max("m", "out"))
            return graph.dstdata["out"]


LAYERS = {
    "sage": lambda d: SAGEConvUDF(d, 5),
    "sage_shrink": lambda d: SAGEConvUDF(d, 3),
    "gcn": lambda d: GraphConvUDF(d, 5),
    "gat": lambda d: GATConvUDF(d, 4, num_heads=3),
    "gated": lambda d: GatedEdgeUDF(d, 6),
    "gatv2": lambda d: GATv2UDF(d, 4),
    "builtin": lambda d: WeightedMaxBuiltin(d, 5),
}


def random_graph(num_nodes: int = 40, num_edges: int = 160, seed: int = 0) -> dgl.DGLGraph:
    """Random multigraph; the last quarter of the nodes have no in-edges."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.randint(0, num_nodes * 3 // 4, (num_edges,), generator=gen)
    src, dst = torch.cat([src, src[:10]]), torch.cat([dst, dst[:10]])  # multi-edges
    g = dgl.graph((src, dst), num_nodes=num_nodes)
    g.edata["w"] = torch.rand(g.num_edges(), 1, generator=gen)
    return g


def sampled_block(seed: int = 0) -> dgl.DGLGraph:
    g = random_graph(seed=seed)
    seeds = torch.tensor([0, 3, 5, 8, 13, 21, 34, 35, 39])  # 34..39 have no in-edges
    frontier = dgl.sampling.sample_neighbors(g, seeds, 4)
    block = dgl.to_block(frontier, seeds)
    block.edata["w"] = g.edata["w"][block.edata[dgl.EID]]
    return block


def make_input(graph, dim: int, pair: bool, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(graph.num_src_nodes(), dim, generator=gen, requires_grad=True)
    if pair:
        return x, torch.randn(graph.num_dst_nodes(), dim, generator=gen, requires_grad=True)
    return x


def forward_backward(layer, graph, feat):
    """Output and gradients (parameters and inputs) of a fixed random projection."""
    inputs = feat if isinstance(feat, tuple) else (feat,)
    for t in [*layer.parameters(), *inputs]:
        t.grad = None
    out = layer(graph, feat)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * weight).sum().backward()
    return out.detach(), [t.grad for t in [*layer.parameters(), *inputs]]


def assert_same(layer, graph, feat, **compile_args):
    ref_out, ref_grads = forward_backward(layer, graph, feat)
    compiled = compile(layer, **compile_args)
    out, grads = forward_backward(compiled, graph, feat)
    assert compiled._programs and all(p.module is not None for p in
                                      compiled._programs.values()), "fell back"
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        if r is None:  # an input the layer does not use
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    return compiled


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("dim", [1, 7, 64])
@pytest.mark.parametrize("graph_kind", ["whole", "block", "block_pair"])
def test_compiled_equals_udf(name, dim, graph_kind):
    torch.manual_seed(0)
    graph = random_graph() if graph_kind == "whole" else sampled_block()
    layer = LAYERS[name](dim)
    assert_same(layer, graph, make_input(graph, dim, graph_kind == "block_pair"))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(2, 30), edges=st.integers(1, 90), seed=st.integers(0, 2**16),
       name=st.sampled_from(["gat", "gated", "gatv2", "sage"]))
def test_compiled_equals_udf_on_random_graphs(nodes, edges, seed, name):
    graph = random_graph(nodes, edges, seed)
    assert_same(LAYERS[name](3), graph, make_input(graph, 3, False, seed))


@pytest.mark.parametrize("level,kernels", [("lower", False), ("reorder", False),
                                           ("fuse", False)])
@pytest.mark.parametrize("name", ["gat", "gated", "gatv2"])
def test_every_level_equals_udf(name, level, kernels):
    torch.manual_seed(0)
    graph = sampled_block()
    assert_same(LAYERS[name](7), graph, make_input(graph, 7, False),
                level=level, kernels=kernels)


def _edge_rows_wider_than(compiled, limit: int) -> list[str]:
    (program,) = compiled._programs.values()
    return [n.format_node() for n in program.module.graph.nodes
            if n.meta.get("space") is Space.EDGE
            and int(torch.tensor(n.meta["shape"][1:]).prod()) > limit]


@pytest.mark.parametrize("graph_kind", ["whole", "block"])
def test_compiled_gat_has_no_edge_feature_tensor(graph_kind):
    graph = random_graph() if graph_kind == "whole" else sampled_block()
    compiled = compile(GATConvUDF(16, 8, num_heads=4), kernels=False)
    compiled(graph, make_input(graph, 16, False))
    assert _edge_rows_wider_than(compiled, 4) == []  # only (edges, heads, 1) scores
    fused = compile(GATConvUDF(16, 8, num_heads=4))
    fused(graph, make_input(graph, 16, False))
    assert _edge_rows_wider_than(fused, 0) == []  # no edge tensor at all
    targets = {n.target for n in fused._programs[(graph.is_block, False, True)]
               .module.graph.nodes}
    assert ops.fused_attention in targets and ops.gather_src not in targets


@pytest.mark.parametrize("graph_kind", ["whole", "block"])
def test_compiled_sage_has_no_edge_values(graph_kind):
    graph = random_graph() if graph_kind == "whole" else sampled_block()
    compiled = compile(SAGEConvUDF(16, 8))
    compiled(graph, make_input(graph, 16, False))
    assert _edge_rows_wider_than(compiled, 0) == []
    (program,) = compiled._programs.values()
    assert any(n.target is ops.gspmm for n in program.module.graph.nodes)


def test_compiled_shares_parameters_and_state_dict():
    layer = GATConvUDF(7, 4, num_heads=2)
    compiled = compile(layer)
    assert list(compiled.parameters()) == list(layer.parameters())
    assert compiled.state_dict().keys() == layer.state_dict().keys()


def test_eval_mode_reaches_the_layer():
    compiled = compile(GATConvUDF(7, 4, num_heads=2))
    compiled.eval()
    assert not compiled.layer.training and not compiled.fc.training
    graph = sampled_block()
    compiled(graph, make_input(graph, 7, False))
    assert list(compiled._programs) == [(True, False, False)]


def test_explain_prints_both_graphs(capsys):
    graph = sampled_block()
    text = compile(GATConvUDF(7, 4, num_heads=2)).explain(graph, make_input(graph, 7, False))
    assert "-- captured --" in text and "-- after passes" in text
    assert "mailbox" in text.split("-- after passes")[0]
    assert "fused_attention" in text.split("-- after passes")[1]
    assert "fused_attention" in capsys.readouterr().out
