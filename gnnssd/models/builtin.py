"""The built-in GNNs: stacks of dgl.nn layers that run on sampled blocks (MFGs)."""
from __future__ import annotations

import dgl
import dgl.nn as dglnn
import torch
from torch import nn

from gnnssd.compiler import GATConvUDF, GraphConvUDF, SAGEConvUDF, compile as compile_layer
from gnnssd.core import ConfigError, ModelConfig
from gnnssd.storage_format import Store


def is_mean_aggregation(conv: nn.Module) -> bool:
    """Whether the layer `conv` sees its neighbours only through the mean of their rows:
    GraphSAGE-mean, DGL's or gnnssd's (a compiled layer's source)."""
    conv = getattr(conv, "_layer", conv)
    return isinstance(conv, SAGEConvUDF) or (isinstance(conv, dglnn.SAGEConv) and conv._aggre_type == "mean")


class BlockGNN(nn.Module):
    """`layers` graph convolutions; ReLU and dropout between them, none after the last.

    The per-layer interface (what layer-wise inference uses, see gnnssd.inference.layerwise):
    `num_layers` and `layer(i, block, h)`, layer i on one block, activation included, and
    optionally `mean_aggregation(i)`.
    """

    def __init__(self, convs: list[nn.Module], dropout: float):
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.dropout = nn.Dropout(dropout)

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def mean_aggregation(self, i: int) -> bool:
        """Whether layer i sees its neighbours only through the mean of their rows
        (GraphSAGE-mean): layer-wise inference may then sum the rows in any order."""
        return is_mean_aggregation(self.convs[i])

    def layer(self, i: int, block: dgl.DGLGraph, h: torch.Tensor) -> torch.Tensor:
        h = self.convs[i](block, h)
        if h.dim() == 3:  # GAT: (nodes, heads, dim) -> concat inner heads, average the last
            h = h.mean(1) if i == len(self.convs) - 1 else h.flatten(1)
        if i < len(self.convs) - 1:
            h = self.dropout(torch.relu(h))
        return h

    def forward(self, blocks: list[dgl.DGLGraph], x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, block in enumerate(blocks):
            h = self.layer(i, block, h)
        return h


class NodeLinear(nn.Module):
    """A linear layer on each destination node's own row: a block's destination nodes
    are the first of its sources, so neighbours are ignored (the MLP model)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)

    def forward(self, block: dgl.DGLGraph, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h[: block.num_dst_nodes()])


def _conv(name: str, compiled: bool, d_in: int, d_out: int, heads: int) -> nn.Module:
    """One layer: the dgl.nn class, or its UDF twin compiled by the MP-DFG compiler."""
    if name == "mlp":
        return NodeLinear(d_in, d_out)
    if name == "sage":
        args, dgl_cls, udf_cls, options = (d_in, d_out, "mean"), dglnn.SAGEConv, SAGEConvUDF, {}
    elif name == "gcn":
        args, dgl_cls, udf_cls = (d_in, d_out), dglnn.GraphConv, GraphConvUDF
        options = {"allow_zero_in_degree": True}
    elif name == "gat":
        args, dgl_cls, udf_cls = (d_in, d_out, heads), dglnn.GATConv, GATConvUDF
        options = {"allow_zero_in_degree": True}
    else:
        raise ValueError(f"model.name {name!r}")
    return compile_layer(udf_cls(*args, **options)) if compiled else dgl_cls(*args, **options)


def build_model(cfg: ModelConfig, in_dim: int, num_classes: int) -> BlockGNN:
    if cfg.name in ("rgcn", "rgat"):
        raise ConfigError(f"model.name: {cfg.name!r} is a relational GNN for heterogeneous stores; "
                          "this store has one node type and one relation: use sage, gcn, gat or mlp")
    dims = [in_dim] + [cfg.hidden] * (cfg.layers - 1) + [num_classes]
    convs: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        if cfg.name == "gat":
            # Hidden layers split `hidden` across heads so widths match the other models.
            last = i == cfg.layers - 1
            d_out = d_out if last else max(1, d_out // cfg.heads)
            d_in = d_in if i == 0 else max(1, cfg.hidden // cfg.heads) * cfg.heads
        convs.append(_conv(cfg.name, cfg.compile, d_in, d_out, cfg.heads))
    return BlockGNN(convs, cfg.dropout)


def store_model(cfg: ModelConfig, store: Store, num_classes: int, every_type: bool = False) -> nn.Module:
    """The built-in model for `store`: a relational GNN over a heterogeneous store's node
    types and relations (gnnssd.models.hetero; `every_type`: a dict of every type's
    outputs), else a BlockGNN."""
    if store.schema.is_homogeneous:
        return build_model(cfg, store.feat_dim, num_classes)
    from .hetero import build_hetero_model

    return build_hetero_model(cfg, store.schema, store.feat_dim, num_classes, every_type)
