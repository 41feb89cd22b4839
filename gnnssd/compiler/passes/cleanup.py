"""Common-subexpression and dead-code elimination.

The reorder pass often produces the same node-wise op twice (e.g. ``fc(h)`` once for
the source side and once for the destination side of a whole graph); CSE merges them.
On a block the destination side reads ``h[:num_dst]``, the prefix of the source rows,
so there the duplicate is ``fc(h[:n])`` next to ``fc(h)`` and becomes ``fc(h)[:n]``.
"""
from __future__ import annotations

import operator

from torch import fx

from gnnssd.compiler.annotate import Space, is_narrow_to_dst
from gnnssd.compiler.passes import replace
from gnnssd.compiler.semantics import RANDOM, is_rowwise, op_name


def _key_of(op: str, target, args, kwargs, node: fx.Node, gm: fx.GraphModule):
    """Identity of a deterministic op application; None for ops that must not merge."""
    if op in ("placeholder", "output") or op_name(node) in RANDOM:
        return None
    if op == "call_module" and "Dropout" in type(gm.get_submodule(target)).__name__:
        return None
    return op, target, repr(args), repr(kwargs)


def _key(node: fx.Node, gm: fx.GraphModule):
    return _key_of(node.op, node.target, node.args, node.kwargs, node, gm)


def cse(gm: fx.GraphModule) -> None:
    """Merge nodes that apply the same deterministic op to the same arguments."""
    seen: dict = {}
    for node in list(gm.graph.nodes):
        key = _key(node, gm)
        if key is None:
            continue
        if key in seen:
            replace(node, seen[key])
        else:
            seen[key] = node


def cse_prefix_rows(gm: fx.GraphModule) -> None:
    """``f(x[:n])`` -> ``f(x)[:n]`` for row-wise f when ``f(x)`` is computed before it."""
    earlier: dict = {}
    for node in list(gm.graph.nodes):
        rows = [a for a in node.all_input_nodes
                if a.meta.get("space") not in (Space.PARAM, Space.SCALAR, Space.GRAPH)]
        full = None
        if rows and all(is_narrow_to_dst(a) for a in rows) and \
                len({a.args[0] for a in rows}) == 1 and is_rowwise(node, gm, rows):
            unsliced = lambda a: a.args[0] if a in rows else a  # noqa: E731
            full = earlier.get(_key_of(node.op, node.target, fx.node.map_arg(node.args, unsliced),
                                       fx.node.map_arg(node.kwargs, unsliced), node, gm))
        if full is not None:
            with gm.graph.inserting_before(node):
                sliced = gm.graph.call_function(operator.getitem, (full, rows[0].args[1]))
            replace(node, sliced)
        elif _key(node, gm) is not None:
            earlier[_key(node, gm)] = node


def dce(gm: fx.GraphModule) -> None:
    """Drop nodes whose values are never used (the graph input always stays)."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op not in ("placeholder", "output") and not node.users:
            gm.graph.erase_node(node)
