"""Fuse gathers into DGL's g-SpMM and g-SDDMM kernels.

``segment_reduce(gather_src(x) op e)`` becomes ``gspmm(op, reduce, x, e)`` and
``gather_src(a) op gather_dst(b)`` becomes ``gsddmm(op, a, b, 'u', 'v')``: the kernels
read node rows in place, so no edge-sized copy of a node feature is ever built.
"""
from __future__ import annotations

from torch import fx

from gnnssd.compiler import ops
from gnnssd.compiler.annotate import Space
from gnnssd.compiler.passes import graph_input, replace
from gnnssd.compiler.semantics import dim_arg, op_name, shape

_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "div": "div"}
_TARGET = {ops.gather_src: "u", ops.gather_dst: "v"}


def _operand(arg) -> tuple[str, fx.Node] | None:
    """(DGL target, tensor) of an edge operand: a fused-away gather or an edge value."""
    if not isinstance(arg, fx.Node) or arg.meta.get("space") is not Space.EDGE:
        return None
    if arg.op == "call_function" and arg.target in _TARGET:
        return _TARGET[arg.target], arg.args[1]
    return "e", arg


def _binary_operands(node: fx.Node):
    if op_name(node) not in _BINARY or len(node.args) != 2 or node.kwargs:
        return None
    lhs, rhs = _operand(node.args[0]), _operand(node.args[1])
    if lhs is None or rhs is None or len(shape(node.args[0])) != len(shape(node.args[1])):
        return None
    return _BINARY[op_name(node)], lhs, rhs


def _is_src_gather(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is ops.gather_src


def fuse_spmm(gm: fx.GraphModule) -> None:
    """gather_src (optionally combined with an edge value) + segment reduce -> g-SpMM."""
    g = graph_input(gm.graph)
    for node in list(gm.graph.nodes):
        if node.target is not ops.segment_reduce:
            continue
        edge, reduce = node.args[1], node.args[2]
        fused = None
        if _is_src_gather(edge):
            fused = ("copy_lhs", reduce, edge.args[1], None)
        elif len(edge.users) == 1 and _binary_operands(edge) is not None:
            op = _binary_operands(edge)[0]
            lhs, rhs = edge.args
            if op in ("add", "mul") and not _is_src_gather(lhs):
                lhs, rhs = rhs, lhs
            if _is_src_gather(lhs) and not _is_src_gather(rhs):
                fused = (op, reduce, lhs.args[1], rhs)
        if fused is not None:
            with gm.graph.inserting_before(node):
                replace(node, gm.graph.call_function(ops.gspmm, (g, *fused)))


def fuse_sddmm(gm: fx.GraphModule) -> None:
    """Ops combining two gathers (or a gather and an edge value) -> g-SDDMM.

    Dot products go first, so their inner product is not fused on its own.
    """
    g = graph_input(gm.graph)
    for match in (_dot_operands, _binary_operands):
        for node in list(gm.graph.nodes):
            args = match(node)
            if args is None:
                continue
            op, (lt, lhs), (rt, rhs) = args
            if lt == rt or "u" not in (lt, rt) and "v" not in (lt, rt):
                continue
            with gm.graph.inserting_before(node):
                replace(node, gm.graph.call_function(ops.gsddmm, (g, op, lhs, rhs, lt, rt)))


def _dot_operands(node: fx.Node):
    """``(x * y).sum(-1, keepdim=True)`` over edge operands -> ('dot', x, y)."""
    if op_name(node) != "sum" or not node.kwargs.get("keepdim") or \
            dim_arg(node) not in (-1, len(shape(node) or ()) - 1):
        return None
    prod = node.args[0]
    inner = _binary_operands(prod) if isinstance(prod, fx.Node) else None
    if inner is None or inner[0] != "mul" or len(prod.users) != 1:
        return None
    return "dot", inner[1], inner[2]
