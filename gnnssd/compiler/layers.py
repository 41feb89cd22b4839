"""Built-in GNN layers written the readable way: DGL message and reduce functions.

Each mirrors a ``dgl.nn`` layer's constructor and parameter names, so
``Layer.from_dgl(conv)`` copies a dgl.nn layer's parameters one to one. Run as is they
are plain DGL (degree-bucketed UDFs); ``gnnssd.compiler.compile`` makes them fast.
``allow_zero_in_degree`` is accepted for signature parity only: destinations without
in-edges always aggregate zero (where dgl.nn raises unless it is True).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from dgl.utils import expand_as_pair
from torch import nn


class _FromDGL:
    """``from_dgl``: build the UDF twin of a dgl.nn layer and copy its parameters."""

    @classmethod
    def _ctor_args(cls, conv: nn.Module) -> dict:
        raise NotImplementedError

    @classmethod
    def from_dgl(cls, conv: nn.Module):
        layer = cls(**cls._ctor_args(conv))
        layer.load_state_dict(conv.state_dict(), strict=True)
        return layer.to(next(conv.parameters()).dtype)


class SAGEConvUDF(_FromDGL, nn.Module):
    """GraphSAGE with the mean aggregator (``dgl.nn.SAGEConv(..., 'mean')``)."""

    def __init__(self, in_feats: int | tuple[int, int], out_feats: int,
                 aggregator_type: str = "mean", bias: bool = True,
                 activation: Callable | None = None):
        super().__init__()
        if aggregator_type != "mean":
            raise ValueError("SAGEConvUDF implements the 'mean' aggregator only")
        in_src, in_dst = expand_as_pair(in_feats)
        self.fc_neigh = nn.Linear(in_src, out_feats, bias=False)
        self.fc_self = nn.Linear(in_dst, out_feats, bias=bias)
        self.activation = activation

    @classmethod
    def _ctor_args(cls, conv) -> dict:
        return dict(in_feats=(conv._in_src_feats, conv._in_dst_feats),
                    out_feats=conv._out_feats, bias=conv.fc_self.bias is not None,
                    activation=conv.activation)

    def message(self, edges):
        return {"m": edges.src["h"]}

    def reduce(self, nodes):
        return {"neigh": nodes.mailbox["m"].mean(1)}

    def forward(self, graph, feat):
        with graph.local_scope():
            h_src, h_dst = expand_as_pair(feat, graph)
            graph.srcdata["h"] = h_src
            graph.update_all(self.message, self.reduce)
            rst = self.fc_self(h_dst) + self.fc_neigh(graph.dstdata["neigh"])
            return self.activation(rst) if self.activation else rst


class GraphConvUDF(_FromDGL, nn.Module):
    """GCN (``dgl.nn.GraphConv(..., norm='both')``), or with ``norm='right'`` the mean of the
    in-neighbours' rows times the weight (R-GCN's per-relation layer)."""

    def __init__(self, in_feats: int, out_feats: int, norm: str = "both",
                 weight: bool = True, bias: bool = True,
                 activation: Callable | None = None, allow_zero_in_degree: bool = True):
        super().__init__()
        if norm not in ("both", "right") or not weight:
            raise ValueError("GraphConvUDF implements norm='both' or 'right' with a weight only")
        self._norm = norm
        self.weight = nn.Parameter(torch.empty(in_feats, out_feats))
        nn.init.xavier_uniform_(self.weight)
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        self.activation = activation

    @classmethod
    def _ctor_args(cls, conv) -> dict:
        return dict(in_feats=conv._in_feats, out_feats=conv._out_feats, norm=conv._norm,
                    bias=conv.bias is not None, activation=conv._activation)

    def message(self, edges):
        if self._norm == "right":
            return {"m": edges.src["h"]}
        return {"m": edges.src["h"] * edges.src["norm"]}

    def reduce(self, nodes):
        return {"h": nodes.mailbox["m"].sum(1)}

    def forward(self, graph, feat):
        with graph.local_scope():
            h_src, _ = expand_as_pair(feat, graph)
            dtype = h_src.dtype
            graph.srcdata["h"] = h_src
            if self._norm == "both":
                graph.srcdata["norm"] = graph.out_degrees().to(dtype).clamp(min=1).pow(-0.5) \
                    .unsqueeze(-1)
            graph.update_all(self.message, self.reduce)
            rst = torch.matmul(graph.dstdata["h"], self.weight)
            power = -0.5 if self._norm == "both" else -1.0
            rst = rst * graph.in_degrees().to(dtype).clamp(min=1).pow(power).unsqueeze(-1)
            if self.bias is not None:
                rst = rst + self.bias
            return self.activation(rst) if self.activation else rst


class GATConvUDF(_FromDGL, nn.Module):
    """Multi-head graph attention (``dgl.nn.GATConv`` without dropout or residual); with
    ``in_feats`` a (source, destination) pair, a map of each side (``fc_src``, ``fc_dst``)."""

    def __init__(self, in_feats: int | tuple[int, int], out_feats: int, num_heads: int,
                 negative_slope: float = 0.2, activation: Callable | None = None,
                 allow_zero_in_degree: bool = True, bias: bool = True):
        super().__init__()
        self._num_heads, self._out_feats = num_heads, out_feats
        if isinstance(in_feats, tuple):
            self.fc_src = nn.Linear(in_feats[0], out_feats * num_heads, bias=False)
            self.fc_dst = nn.Linear(in_feats[1], out_feats * num_heads, bias=False)
        else:
            self.fc = nn.Linear(in_feats, out_feats * num_heads, bias=False)
        self.attn_l = nn.Parameter(torch.randn(1, num_heads, out_feats) * 0.1)
        self.attn_r = nn.Parameter(torch.randn(1, num_heads, out_feats) * 0.1)
        self.bias = nn.Parameter(torch.zeros(num_heads * out_feats)) if bias else None
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        self.activation = activation

    @classmethod
    def _ctor_args(cls, conv) -> dict:
        if conv.res_fc is not None:
            raise ValueError("GATConvUDF mirrors GATConv without residual")
        pair = hasattr(conv, "fc_src")
        return dict(in_feats=(conv._in_src_feats, conv._in_dst_feats) if pair else conv._in_src_feats,
                    out_feats=conv._out_feats,
                    num_heads=conv._num_heads,
                    negative_slope=conv.leaky_relu.negative_slope,
                    activation=conv.activation, bias=conv.bias is not None)

    def message(self, edges):
        heads, feats = self._num_heads, self._out_feats
        fc_src, fc_dst = (self.fc_src, self.fc_dst) if hasattr(self, "fc_src") else (self.fc, self.fc)
        z_src = fc_src(edges.src["h"]).view(-1, heads, feats)
        z_dst = fc_dst(edges.dst["h"]).view(-1, heads, feats)
        el = (z_src * self.attn_l).sum(-1, keepdim=True)
        er = (z_dst * self.attn_r).sum(-1, keepdim=True)
        return {"z": z_src, "e": self.leaky_relu(el + er)}

    def reduce(self, nodes):
        alpha = torch.softmax(nodes.mailbox["e"], dim=1)
        return {"ft": (alpha * nodes.mailbox["z"]).sum(1)}

    def forward(self, graph, feat):
        with graph.local_scope():
            h_src, h_dst = expand_as_pair(feat, graph)
            graph.srcdata["h"] = h_src
            graph.dstdata["h"] = h_dst
            graph.update_all(self.message, self.reduce)
            rst = graph.dstdata["ft"]
            if self.bias is not None:
                rst = rst + self.bias.view(1, self._num_heads, self._out_feats)
            return self.activation(rst) if self.activation else rst
