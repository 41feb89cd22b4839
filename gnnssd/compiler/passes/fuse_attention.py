"""Recognise attention aggregation and hand it to the fused kernel.

``gspmm(mul, sum, z, edge_softmax(leaky_relu(gsddmm(add, el, er, u, v))))`` is GAT's
aggregation. DGL runs it as four kernels with three edge-sized tensors kept for
backward; :func:`ops.fused_attention` does it in one pass per destination.
"""
from __future__ import annotations

from torch import fx, nn

from gnnssd.compiler import ops
from gnnssd.compiler.passes import graph_input, replace
from gnnssd.compiler.semantics import op_name, shape


def _only_user(node: fx.Node, user: fx.Node) -> bool:
    return list(node.users) == [user]


def _leaky_relu(node: fx.Node, gm: fx.GraphModule):
    """(input, slope) if ``node`` is a leaky ReLU."""
    if node.op == "call_module" and isinstance(gm.get_submodule(node.target), nn.LeakyReLU):
        return node.args[0], gm.get_submodule(node.target).negative_slope
    if op_name(node) == "leaky_relu":
        slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
        return node.args[0], slope
    return None


def fuse_attention(gm: fx.GraphModule) -> None:
    g = graph_input(gm.graph)
    for node in list(gm.graph.nodes):
        if node.target is not ops.gspmm or node.args[1:3] != ("mul", "sum"):
            continue
        z, attn = node.args[3], node.args[4]
        if attn.target is not ops.edge_softmax or not _only_user(attn, node):
            continue
        score = attn.args[1]
        leaky = _leaky_relu(score, gm)
        pre, slope = leaky if leaky else (score, 1.0)
        if leaky and not _only_user(score, attn):
            continue
        if pre.target is not ops.gsddmm or pre.args[1:2] != ("add",) or \
                pre.args[4:6] != ("u", "v") or not _only_user(pre, score):
            continue
        zs, a = shape(z), shape(attn)
        if a[-1] != 1 or len(zs) != len(a) or zs[1:-1] != a[1:-1] or \
                not isinstance(slope, float):
            continue
        with gm.graph.inserting_before(node):
            replace(node, gm.graph.call_function(
                ops.fused_attention, (g, pre.args[2], pre.args[3], z, slope)))
