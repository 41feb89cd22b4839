"""Annotate the MP-DFG: where every value lives and how every op moves data.

Spaces: ``src``/``dst`` node rows of a block, ``node`` rows of a whole graph (where the
two coincide), ``edge`` rows, ``mailbox`` (edge rows in DGL's per-destination layout,
only before the mailbox passes), ``param`` (no row dimension) and ``scalar``.
"""
from __future__ import annotations

from enum import Enum

import torch
from torch import fx

from gnnssd.compiler import ops
from gnnssd.compiler.errors import CaptureError
from gnnssd.compiler.semantics import REDUCTIONS, dim_arg, op_name


class Space(str, Enum):
    GRAPH = "graph"
    SRC = "src"
    DST = "dst"
    NODE = "node"
    EDGE = "edge"
    MAILBOX = "mailbox"
    PARAM = "param"
    SCALAR = "scalar"


_ROWLESS = {Space.PARAM, Space.SCALAR, Space.GRAPH}
_SHAPE_QUERIES = {"size", "dim", "numel", "shape"}


def is_whole_graph(graph: fx.Graph) -> bool:
    return next(iter(graph.nodes)).meta.get("whole_graph", False)


def is_narrow_to_dst(node: fx.Node) -> bool:
    """``x[:num_dst_nodes(g)]``: the destination prefix of a block's source rows."""
    if op_name(node) != "getitem":
        return False
    idx = node.args[1]
    idx = idx[0] if isinstance(idx, tuple) and len(idx) == 1 else idx
    return (isinstance(idx, slice) and idx.start in (None, 0) and idx.step is None
            and isinstance(idx.stop, fx.Node) and idx.stop.target is ops.num_dst_nodes)


def _reduces_mailbox(node: fx.Node) -> bool:
    """A reduction over the mailbox's neighbour dim: the value lives on destinations."""
    return op_name(node) in REDUCTIONS and dim_arg(node) == 1 and \
        isinstance(node.args[0], fx.Node) and node.args[0].meta["space"] is Space.MAILBOX


def _primitive_space(node: fx.Node, whole: bool) -> Space:
    src, dst = (Space.NODE, Space.NODE) if whole else (Space.SRC, Space.DST)
    t = node.target
    if t is ops.read_data:
        return {"src": src, "dst": dst, "edge": Space.EDGE}[node.args[1]]
    if t is ops.num_dst_nodes:
        return Space.SCALAR
    if t is ops.out_degrees:
        return src
    if t in (ops.in_degrees, ops.segment_reduce, ops.gspmm, ops.fused_attention):
        return dst
    if t is ops.mailbox:
        return Space.MAILBOX
    if t is ops.edge_softmax:
        arg = node.args[1].meta["space"]
        return Space.MAILBOX if arg is Space.MAILBOX else Space.EDGE
    return Space.EDGE  # gathers and g-SDDMM


def _check_gather(node: fx.Node, whole: bool) -> None:
    want = {ops.gather_src: Space.SRC, ops.gather_dst: Space.DST}.get(node.target)
    if want is None:
        return
    got = node.args[1].meta["space"]
    if got not in (Space.NODE if whole else want, Space.PARAM):
        raise CaptureError(f"{node.name} gathers a value living on {got.value}, "
                           f"expected {want.value}")


def _join(node: fx.Node) -> Space:
    spaces = {a.meta["space"] for a in node.all_input_nodes} - _ROWLESS
    if op_name(node) in _SHAPE_QUERIES or node.target is getattr:
        if Space.MAILBOX in spaces and node.args[1:] != ("dtype",):
            raise CaptureError(f"{node.format_node()} reads the shape of a mailbox (its "
                               "degree bucket), which has no edge-wise equivalent")
        return Space.SCALAR
    if not spaces:
        return Space.PARAM
    if len(spaces) > 1:
        names = ", ".join(sorted(s.value for s in spaces))
        raise CaptureError(f"{node.format_node()} mixes values living on {names} "
                           "without a gather or reduction between them")
    return spaces.pop()


def annotate(graph: fx.Graph) -> None:
    """Set ``meta['space']`` and ``meta['movement']`` on every node (in place)."""
    whole = is_whole_graph(graph)
    for node in graph.nodes:
        if node.op == "placeholder":
            node.meta["movement"] = ops.Movement.INPUT
            continue  # its space is set at capture
        if node.op == "output":
            continue
        if node.op == "get_attr":
            node.meta["space"], node.meta["movement"] = Space.PARAM, ops.Movement.DENSE
            continue
        if node.op == "call_function" and node.target in ops.MOVEMENT:
            _check_gather(node, whole)
            node.meta["space"] = _primitive_space(node, whole)
            node.meta["movement"] = ops.MOVEMENT[node.target]
            continue
        node.meta["movement"] = ops.Movement.DENSE
        if is_narrow_to_dst(node) and node.args[0].meta["space"] is Space.SRC:
            node.meta["space"] = Space.DST
        elif _reduces_mailbox(node):
            node.meta["space"] = Space.NODE if whole else Space.DST
        else:
            node.meta["space"] = _join(node)


class _ShapeRecorder(fx.Interpreter):
    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            n.meta["shape"] = tuple(result.shape)
        return result


def propagate_shapes(gm: fx.GraphModule, *inputs) -> None:
    """Run the program once on inputs (the layer's own, on a graph of a few of its edges:
    block.few_edges) and record every tensor's shape."""
    with torch.no_grad():
        _ShapeRecorder(gm).run(*inputs)
