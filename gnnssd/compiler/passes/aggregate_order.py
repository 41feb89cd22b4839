"""Apply a shrinking linear map before a sum/mean aggregation instead of after it.

``W @ mean_u x[u] == mean_u (W @ x)[u]`` for a map without bias (zero stays zero at
destinations without in-edges). When W maps to fewer features than it reads, the
aggregation then moves fewer bytes; this is dgl.nn.SAGEConv's ``lin_before_mp``.
"""
from __future__ import annotations

from torch import fx

from gnnssd.compiler import ops
from gnnssd.compiler.annotate import Space
from gnnssd.compiler.passes import replace
from gnnssd.compiler.semantics import is_rowwise, op_name, shape


def _is_bias_free_linear(node: fx.Node, gm: fx.GraphModule) -> bool:
    if op_name(node) == "matmul":
        return isinstance(node.args[1], fx.Node) and node.args[1].meta["space"] is Space.PARAM
    if node.op == "call_module":
        return getattr(gm.get_submodule(node.target), "bias", 0) is None
    return op_name(node) == "linear" and len(node.args) == 2


def linear_before_aggregate(gm: fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op not in ("call_module", "call_function", "call_method") or not node.args:
            continue
        agg = node.args[0]
        if not (isinstance(agg, fx.Node) and agg.target is ops.segment_reduce
                and agg.args[2] in ("sum", "mean") and list(agg.users) == [node]
                and agg.args[1].target is ops.gather_src
                and _is_bias_free_linear(node, gm) and is_rowwise(node, gm, [agg])
                and shape(node)[-1] < shape(agg)[-1]):
            continue
        x = agg.args[1].args[1]
        with gm.graph.inserting_before(node):
            mapped = gm.graph.create_node(node.op, node.target, (x,) + node.args[1:],
                                          dict(node.kwargs))
            gathered = gm.graph.call_function(ops.gather_src, (agg.args[0], mapped))
            reduced = gm.graph.call_function(ops.segment_reduce,
                                             (agg.args[0], gathered, agg.args[2]))
        mapped.meta["shape"] = shape(x)[:-1] + shape(node)[-1:]
        gathered.meta["shape"] = shape(agg.args[1])[:-1] + shape(node)[-1:]
        reduced.meta["shape"] = shape(node)
        replace(node, reduced)
