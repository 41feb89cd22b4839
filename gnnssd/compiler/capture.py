"""Capture a DGL-style layer into an MP-DFG with torch.fx.

The layer's ``forward`` runs once with fx proxies for its features and a
:class:`SymbolicGraph` standing in for the DGL graph. The symbolic graph records
message passing as primitives from :mod:`.ops`: ``edges.src[k]`` becomes
``gather_src``, ``nodes.mailbox[k]`` becomes ``mailbox`` and so on, while node-wise
code (linear maps, activations) is recorded as ordinary torch ops.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, MutableMapping

import dgl.function as dglfn
from torch import fx, nn

from gnnssd.compiler import ops
from gnnssd.compiler.annotate import Space
from gnnssd.compiler.errors import CaptureError
from gnnssd.compiler.semantics import is_inplace


class _DataView(MutableMapping):
    """``graph.srcdata``-like mapping; keys never written in the layer are graph inputs."""

    def __init__(self, graph: "SymbolicGraph", kind: str, store: dict):
        self._graph, self._kind, self._store = graph, kind, store

    def __getitem__(self, key: str) -> fx.Proxy:
        if key not in self._store:
            self._store[key] = self._graph._call(ops.read_data, self._kind, key)
        return self._store[key]

    def __setitem__(self, key: str, value) -> None:
        if not isinstance(value, fx.Proxy):
            raise CaptureError(f"graph data '{key}' must be computed from the layer's inputs")
        self._store[key] = value

    def __delitem__(self, key: str) -> None:
        del self._store[key]

    def __iter__(self):
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)


class _GatherView:
    """``edges.src`` / ``edges.dst``: node data gathered onto edges, once per key."""

    def __init__(self, graph: "SymbolicGraph", gather: Callable, data: _DataView):
        self._graph, self._gather, self._data, self._cache = graph, gather, data, {}

    def __getitem__(self, key: str) -> fx.Proxy:
        if key not in self._cache:
            self._cache[key] = self._graph._call(self._gather, self._data[key])
        return self._cache[key]


class EdgeBatch:
    def __init__(self, graph: "SymbolicGraph"):
        self.src = _GatherView(graph, ops.gather_src, graph.srcdata)
        self.dst = _GatherView(graph, ops.gather_dst, graph.dstdata)
        self.data = graph.edata


class NodeBatch:
    def __init__(self, graph: "SymbolicGraph", messages: dict):
        self.data = graph.dstdata
        self.mailbox = {k: graph._call(ops.mailbox, v) for k, v in messages.items()}


class SymbolicGraph:
    """Stands in for a DGL graph or block while a layer is traced."""

    def __init__(self, tracer: fx.Tracer, proxy: fx.Proxy, is_block: bool):
        self._tracer, self._proxy, self.is_block = tracer, proxy, is_block
        src: dict = {}
        self.srcdata = _DataView(self, "src", src)
        self.dstdata = _DataView(self, "dst", {} if is_block else src)
        self.edata = _DataView(self, "edge", {})
        if not is_block:
            self.ndata = self.srcdata

    def _call(self, fn: Callable, *args) -> fx.Proxy:
        return self._tracer.create_proxy("call_function", fn, (self._proxy, *args), {})

    def __getattr__(self, name: str):
        raise CaptureError(f"graph.{name} is not supported inside a compiled layer")

    @contextlib.contextmanager
    def local_scope(self):
        views = (self.srcdata, self.dstdata, self.edata)
        saved = [dict(v._store) for v in views]
        try:
            yield self
        finally:
            for view, store in zip(views, saved):
                view._store.clear()
                view._store.update(store)

    def number_of_dst_nodes(self) -> fx.Proxy:
        return self._call(ops.num_dst_nodes)

    num_dst_nodes = number_of_dst_nodes

    def in_degrees(self) -> fx.Proxy:
        return self._call(ops.in_degrees)

    def out_degrees(self) -> fx.Proxy:
        return self._call(ops.out_degrees)

    def apply_edges(self, func) -> None:
        self.edata.update(self._messages(func))

    def update_all(self, message_func, reduce_func, apply_node_func=None) -> None:
        messages = self._messages(message_func)
        if isinstance(reduce_func, dglfn.reducer.SimpleReduceFunction):
            out = {reduce_func.out_field: self._call(
                ops.segment_reduce, messages[reduce_func.msg_field], reduce_func._name)}
        else:
            out = reduce_func(NodeBatch(self, messages))
        self.dstdata.update(_check_dict(out, "reduce"))
        if apply_node_func is not None:
            self.dstdata.update(_check_dict(apply_node_func(NodeBatch(self, {})), "apply"))

    def _messages(self, func) -> dict:
        edges = EdgeBatch(self)
        if isinstance(func, dglfn.message.CopyMessageFunction):
            return {func.out_field: _side(edges, func.target)[func.in_field]}
        if isinstance(func, dglfn.message.BinaryMessageFunction):
            lhs = _side(edges, func.lhs)[func.lhs_field]
            rhs = _side(edges, func.rhs)[func.rhs_field]
            if func.binary_op == "dot":
                return {func.out_field: (lhs * rhs).sum(-1, keepdim=True)}
            return {func.out_field: getattr(lhs, f"__{func.binary_op}__".replace(
                "div", "truediv"))(rhs)}
        return _check_dict(func(edges), "message")


def _side(edges: EdgeBatch, target: str):
    codes = dglfn.base.TargetCode
    return {codes.SRC: edges.src, codes.DST: edges.dst, codes.EDGE: edges.data}[target]


def _check_dict(out, what: str) -> dict:
    if not isinstance(out, dict):
        raise CaptureError(f"the {what} function must return a dict of tensors")
    return out


class _Tracer(fx.Tracer):
    traced_func_name = "_trace_entry"

    def __init__(self, is_block: bool, pair: bool):
        super().__init__()
        self.is_block, self.pair = is_block, pair

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if kind in ("call_function", "call_method") and is_inplace(node):
            raise CaptureError(f"in-place op {node.format_node()} is not supported")
        return node


def capture(root: nn.Module, is_block: bool, pair: bool) -> fx.GraphModule:
    """Trace ``root._trace_entry(graph, feat_src, feat_dst)`` into an MP-DFG.

    ``_trace_entry`` hands its arguments to :func:`trace_layer` together with the
    layer. ``root`` holds the layer's submodules and parameters under the same names,
    so the program's ``get_attr``/``call_module`` nodes resolve to the same objects.
    """
    graph = _Tracer(is_block, pair).trace(root)
    whole = not is_block
    spaces = [Space.GRAPH, Space.NODE if whole else Space.SRC,
              Space.NODE if whole else Space.DST]
    for node, space in zip([n for n in graph.nodes if n.op == "placeholder"], spaces):
        node.meta["space"] = space
    next(iter(graph.nodes)).meta["whole_graph"] = whole
    return fx.GraphModule(root, graph)


def trace_layer(layer: nn.Module, graph_proxy: fx.Proxy, feat_src, feat_dst):
    """Run ``layer.forward`` on a symbolic graph (called from ``root._trace_entry``)."""
    tracer = graph_proxy.tracer
    graph = SymbolicGraph(tracer, graph_proxy, tracer.is_block)
    return layer.forward(graph, (feat_src, feat_dst) if tracer.pair else feat_src)
