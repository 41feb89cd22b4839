"""Rewrite DGL's mailbox layout into edge-wise segment operations.

``nodes.mailbox[k]`` is a (destinations, degree, ...) tensor that DGL builds by
bucketing destinations by degree. The same values in edge order need no bucketing:
a reduction over the mailbox's neighbour dimension is a segment reduction, a softmax
over it is an edge softmax, and anything else is edge-wise once dims are shifted.
"""
from __future__ import annotations

import operator

from torch import fx

from gnnssd.compiler import ops
from gnnssd.compiler.annotate import Space, annotate
from gnnssd.compiler.errors import CaptureError
from gnnssd.compiler.passes import graph_input, replace
from gnnssd.compiler.semantics import DIM_OPS, ELEMENTWISE, REDUCTIONS, dim_arg, op_name, set_dim_arg


def _on_mailbox(node: fx.Node) -> bool:
    return bool(node.args) and isinstance(node.args[0], fx.Node) and \
        node.args[0].meta.get("space") is Space.MAILBOX


def _neighbour_dim_op(node: fx.Node, names) -> bool:
    return op_name(node) in names and _on_mailbox(node) and dim_arg(node) == 1 \
        and not node.kwargs.get("keepdim", False) and len(node.args) <= 2


def rewrite_mailbox_reductions(gm: fx.GraphModule) -> None:
    """``mailbox.sum(1)`` (mean, max, min, amax, amin) -> ``segment_reduce``."""
    g = graph_input(gm.graph)
    annotate(gm.graph)
    for node in list(gm.graph.nodes):
        if not _neighbour_dim_op(node, REDUCTIONS):
            continue
        with gm.graph.inserting_before(node):
            seg = gm.graph.call_function(ops.segment_reduce,
                                         (g, node.args[0], REDUCTIONS[op_name(node)]))
        if op_name(node) in ("max", "min"):  # returns (values, indices)
            for user in list(node.users):
                if op_name(user) == "getitem" and user.args[1] == 0 or (
                        user.op == "call_function" and user.target is getattr
                        and user.args[1] == "values"):
                    replace(user, seg)
                else:
                    raise CaptureError(f"{user.format_node()}: only the values of a "
                                       "mailbox max/min can be lowered")
            gm.graph.erase_node(node)
        else:
            replace(node, seg)
        annotate(gm.graph)


def rewrite_mailbox_softmax(gm: fx.GraphModule) -> None:
    """``softmax(mailbox, dim=1)`` -> ``edge_softmax`` (normalised per destination)."""
    g = graph_input(gm.graph)
    annotate(gm.graph)
    for node in list(gm.graph.nodes):
        if _neighbour_dim_op(node, {"softmax"}) and node.kwargs.get("dtype") is None:
            with gm.graph.inserting_before(node):
                replace(node, gm.graph.call_function(ops.edge_softmax, (g, node.args[0])))
            annotate(gm.graph)


def _shift(dim, node: fx.Node):
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    if any(isinstance(d, int) and d in (0, 1) for d in dims):
        raise CaptureError(f"{node.format_node()} works across mailbox rows (dimension "
                           "0 or 1); only sum/mean/max/min/softmax over dim 1 can be lowered")
    shifted = [d - 1 if isinstance(d, int) and d >= 2 else d for d in dims]
    return type(dim)(shifted) if isinstance(dim, (tuple, list)) else shifted[0]


def strip_mailbox(gm: fx.GraphModule) -> None:
    """Turn the remaining mailbox-layout ops into edge-wise ops and drop the markers."""
    annotate(gm.graph)
    for node in list(gm.graph.nodes):
        if node.meta.get("space") is not Space.MAILBOX or node.target in ops.MOVEMENT:
            continue
        name = op_name(node)
        if name in DIM_OPS and dim_arg(node) is not None:
            set_dim_arg(node, _shift(dim_arg(node), node))
        elif name == "getitem":
            idx = node.args[1]
            if not (isinstance(idx, tuple) and (idx[0] is Ellipsis or idx[:2] == (
                    slice(None), slice(None)))):
                raise CaptureError(f"{node.format_node()}: unsupported mailbox indexing")
            if idx[0] is not Ellipsis:
                node.update_arg(1, (slice(None),) + idx[2:])
        elif not (name in ELEMENTWISE or name in ("linear", "matmul")
                  or node.op == "call_module" or node.target is operator.getitem):
            raise CaptureError(f"{node.format_node()}: cannot lower {name or node.target} "
                               "on mailbox values")
    for node in list(gm.graph.nodes):
        if node.target is ops.mailbox:
            replace(node, node.args[1])


MAILBOX_PASSES = (rewrite_mailbox_reductions, rewrite_mailbox_softmax, strip_mailbox)
