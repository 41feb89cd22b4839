"""Move node-wise ops before the gather: compute per node, not per edge.

``f(gather(x))`` equals ``gather(f(x))`` whenever f is row-wise, and the right-hand
side runs f once per node instead of once per edge. Applied in program order, a
chain of node-wise ops (linear map, reshape, product with a parameter, activation)
moves up to the node side as a whole.
"""
from __future__ import annotations

from torch import fx

from gnnssd.compiler import ops
from gnnssd.compiler.annotate import Space
from gnnssd.compiler.passes import replace
from gnnssd.compiler.semantics import is_rowwise, shape


def _row_args(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes
            if a.meta.get("space") not in (Space.PARAM, Space.SCALAR, Space.GRAPH)]


def hoist_nodewise(gm: fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module") or \
                node.target in ops.MOVEMENT:
            continue
        rows = _row_args(node)
        kinds = {a.target for a in rows if a.op == "call_function"}
        if not rows or len(kinds) != 1 or kinds.pop() not in ops.GATHERS or \
                not all(a.op == "call_function" for a in rows):
            continue
        if not is_rowwise(node, gm, rows):
            continue
        gather, graph = rows[0].target, rows[0].args[0]
        with gm.graph.inserting_before(node):
            args = fx.node.map_arg(node.args, lambda a: a.args[1] if a in rows else a)
            kwargs = fx.node.map_arg(node.kwargs, lambda a: a.args[1] if a in rows else a)
            moved = gm.graph.create_node(node.op, node.target, args, kwargs)
            regathered = gm.graph.call_function(gather, (graph, moved))
        moved.meta["shape"] = (shape(rows[0].args[1])[0],) + shape(node)[1:]
        moved.meta["space"] = rows[0].args[1].meta["space"]
        regathered.meta.update(shape=shape(node), space=Space.EDGE)
        replace(node, regathered)
