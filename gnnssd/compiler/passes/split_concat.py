"""Split a linear map of concatenated features into one map per part.

``W @ cat([gather_src(a), gather_dst(b)])`` mixes source and destination rows, so it
cannot move before the gathers. Written as ``W_a @ gather_src(a) + W_b @ gather_dst(b)``
each product is node-wise, the reorder pass hoists it, and the sum becomes a g-SDDMM.
"""
from __future__ import annotations

import operator

import torch.nn.functional as F
from torch import fx, nn

from gnnssd.compiler.semantics import dim_arg, op_name, shape


def _linear_parts(node: fx.Node, gm: fx.GraphModule):
    """(input, weight, bias) of a linear map node as graph values, else None."""
    if node.op == "call_module" and isinstance(gm.get_submodule(node.target), nn.Linear):
        mod = gm.get_submodule(node.target)
        with gm.graph.inserting_before(node):
            weight = gm.graph.get_attr(f"{node.target}.weight")
            bias = gm.graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
        weight.meta["shape"] = tuple(mod.weight.shape)
        return node.args[0], weight, bias
    if op_name(node) == "linear" and not node.kwargs:
        return node.args[0], node.args[1], node.args[2] if len(node.args) > 2 else None
    return None


def _is_feature_cat(node) -> bool:
    if not isinstance(node, fx.Node) or op_name(node) != "cat" or shape(node) is None:
        return False
    return dim_arg(node) in (-1, len(shape(node)) - 1) and len(node.args[0]) > 1


def split_concat_linear(gm: fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if not (node.op == "call_module" or op_name(node) == "linear") or \
                not node.args or not _is_feature_cat(node.args[0]):
            continue
        parts = _linear_parts(node, gm)
        if parts is None:
            continue
        cat, weight, bias = parts
        total, offset = None, 0
        with gm.graph.inserting_before(node):
            for i, piece in enumerate(cat.args[0]):
                width = shape(piece)[-1]
                w = gm.graph.call_function(
                    operator.getitem, (weight, (slice(None), slice(offset, offset + width))))
                w.meta["shape"] = (shape(weight)[0], width)
                term = gm.graph.call_function(
                    F.linear, (piece, w, bias) if i == 0 and bias is not None else (piece, w))
                term.meta["shape"] = shape(piece)[:-1] + (shape(weight)[0],)
                total = term if total is None else gm.graph.call_function(
                    operator.add, (total, term))
                total.meta["shape"] = term.meta["shape"]
                offset += width
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)
