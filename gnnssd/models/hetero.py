"""Relational GNNs for heterogeneous stores: R-GCN and R-GAT over DGL's heterogeneous blocks.

Each layer is built as DGL's own R-GCN example (examples/core/rgcn/hetero_rgcn.py) builds
its: per relation a convolution that averages over the relation's in-neighbours
(R-GCN: GraphConv with norm="right" and the relation's own weight; R-GAT: GAT, whose
attention is a weighted mean), summed over the relations into each destination type,
plus a self-loop linear map of the destination's own input per node type (with the
bias). Averaging per relation keeps a node's input on the scale of its features whatever
its degree; summing unnormalised per-relation layers made the first epochs' loss an
order of magnitude higher and cost accuracy. Featureless node types (MAG240M's authors
and institutions) enter as a learnable embedding per node, xavier-initialised as DGL's
HeteroEmbedding (`model.featureless: embedding`, the default, counted in the model's
memory), or as zeros (`featureless: zeros`: nothing node-sized is held; their
information comes from their neighbours).

With `model.compile: true` (the default) each relation's convolution is its UDF twin
compiled by the MP-DFG compiler (gnnssd.compiler.hetero): same parameters and checkpoint
keys, same outputs, and it runs on a typed block's per-relation CSC tensors, so on a GPU
without DGL's CUDA build too; `compile: false` keeps dgl.nn's HeteroGraphConv.
"""
from __future__ import annotations

import dgl
import dgl.nn as dglnn
import torch
from torch import nn

from gnnssd.compiler import GATConvUDF, GraphConvUDF, HeteroGraphConvCompiled, TypedCSCBlock
from gnnssd.compiler import compile as compile_layer
from gnnssd.core import ConfigError, ModelConfig
from gnnssd.storage_format import GraphSchema


def _relation_conv(name: str, d_in: int | tuple[int, int], d_out: int, heads: int, compiled: bool) -> nn.Module:
    """One relation's convolution, a mean over the relation's in-neighbours (no bias: the
    self-loop map has it); d_in a (source, destination) pair when the two types' inputs
    differ in width (featured types of different dims, layer 0). `compiled`: the UDF twin
    compiled by gnnssd.compiler (same parameter names and shapes)."""
    if name == "rgcn":
        d_src = d_in[0] if isinstance(d_in, tuple) else d_in
        if compiled:
            return compile_layer(GraphConvUDF(d_src, d_out, norm="right", bias=False))
        return dglnn.GraphConv(d_src, d_out, norm="right", bias=False, allow_zero_in_degree=True)
    if compiled:  # without the numba attention kernel: on a relation's small blocks it cost more
        # than DGL's ops on the CPU (docs/BENCHMARKS.md, "Issue 31: R-GCN and R-GAT compiled")
        return compile_layer(GATConvUDF(d_in, d_out, heads, bias=False), kernels=False)
    return dglnn.GATConv(d_in, d_out, heads, bias=False, allow_zero_in_degree=True)


def _hetero_conv(mods: dict[str, nn.Module], compiled: bool) -> nn.Module:
    """The relations' convolutions summed into each destination type."""
    return HeteroGraphConvCompiled(mods) if compiled else dglnn.HeteroGraphConv(mods, aggregate="sum")


class RelationalGNN(nn.Module):
    """`layers` relational layers; ReLU and dropout between them, none after the last.
    Takes the blocks and x (a dict of the featured types' rows) and returns the target
    type's logits, or with `every_type` a dict of every type's outputs (the embeddings a
    link task on a relation scores). Per-layer protocol as BlockGNN: `num_layers`,
    `layer(i, block, h)`."""

    def __init__(self, cfg: ModelConfig, schema: GraphSchema, feat_dim: int, num_classes: int,
                 every_type: bool = False):
        super().__init__()
        self.target = schema.target
        self.every_type = every_type
        self.feat_dim = feat_dim
        self.featureless = [t.name for t in schema.node_types if not t.features]
        self.embeddings = nn.ModuleDict(
            {t.name: nn.Embedding(t.count, feat_dim) for t in schema.node_types if not t.features}
            if cfg.featureless == "embedding" else {})
        for embedding in self.embeddings.values():
            nn.init.xavier_uniform_(embedding.weight)  # as DGL's HeteroEmbedding: rows on the features' scale
        heads = cfg.heads if cfg.name == "rgat" else 1
        self.convs = nn.ModuleList()
        self.loops = nn.ModuleList()  # per layer, per node type: the self-loop map
        self.widths: list[int] = []  # each layer's output width per node
        # each type's input width: its own dim (featureless types: feat_dim zeros or embeddings)
        d_in = {t.name: t.dim or feat_dim for t in schema.node_types}
        for i in range(cfg.layers):
            last = i == cfg.layers - 1
            # hidden widths split across heads (concatenated); the last layer's heads averaged
            per_head = num_classes if last else max(1, cfg.hidden // heads)
            self.convs.append(_hetero_conv(
                {rel: _relation_conv(cfg.name, d_in[s] if d_in[s] == d_in[d] else (d_in[s], d_in[d]), per_head,
                                     heads, cfg.compile)
                 for s, rel, d in schema.relations}, cfg.compile))
            width = per_head if last else per_head * heads
            self.loops.append(nn.ModuleDict({name: nn.Linear(d, width) for name, d in d_in.items()}))
            d_in = dict.fromkeys(d_in, width)
            self.widths.append(width)
        self.dropout = nn.Dropout(cfg.dropout)

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def inputs(self, block: dgl.DGLGraph | TypedCSCBlock, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The first block's source rows of every type: x for featured types, the embedding
        of each node (by its dataset ID, dgl.NID) or zeros for featureless ones."""
        h = dict(x)
        for name in self.featureless:
            count = block.num_src_nodes(name)
            if name in self.embeddings:
                ids = block.src_ids[name] if isinstance(block, TypedCSCBlock) else block.srcnodes[name].data[dgl.NID]
                h[name] = self.embeddings[name](ids)
            else:
                h[name] = torch.zeros(count, self.feat_dim, device=block.device)
        return h

    def layer(self, i: int, block: dgl.DGLGraph | TypedCSCBlock, h: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.convs[i](block, h)
        last = i == self.num_layers - 1
        result = {}
        for name in block.dsttypes:
            count = block.num_dst_nodes(name)
            value = out.get(name)
            if value is None:  # no edge reached this type in this block: nothing aggregated
                value = torch.zeros(count, self.widths[i], device=block.device)
            elif value.dim() == 3:  # GAT: (nodes, heads, dim) -> concat inner heads, average the last
                value = value.mean(1) if last else value.flatten(1)
            if count:  # a block's destinations are among its sources: h has their rows
                value = value + self.loops[i][name](h[name][:count])
            result[name] = value if last else self.dropout(torch.relu(value))
        return result

    def forward(self, blocks: list[dgl.DGLGraph] | list[TypedCSCBlock],
                x: dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        h = self.inputs(blocks[0], x)
        for i, block in enumerate(blocks):
            h = self.layer(i, block, h)
        return h if self.every_type else h[self.target]


class TargetLinear(nn.Module):
    """The MLP floor on a heterogeneous store: a linear layer on the target type's own
    rows (the last block's destinations are the first of the first block's sources)."""

    def __init__(self, schema: GraphSchema, feat_dim: int, num_classes: int):
        super().__init__()
        self.target = schema.target
        self.linear = nn.Linear(schema.node_types[schema.type_id(schema.target)].dim or feat_dim, num_classes)

    num_layers = 1

    def layer(self, i: int, block: dgl.DGLGraph | TypedCSCBlock, h: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The per-layer protocol of RelationalGNN (layer-wise inference): its one layer."""
        return {self.target: self.linear(h[self.target][: block.num_dst_nodes(self.target)])}

    def forward(self, blocks: list[dgl.DGLGraph], x: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.layer(0, blocks[-1], x)[self.target]


def build_hetero_model(cfg: ModelConfig, schema: GraphSchema, feat_dim: int, num_classes: int,
                       every_type: bool = False) -> nn.Module:
    """The built-in model of a heterogeneous store: rgcn, rgat, or mlp on the target type;
    `every_type`: outputs for every node type (rgcn, rgat)."""
    if cfg.name == "mlp" and every_type:
        raise ConfigError("model.name: mlp embeds the target type only; a link task on a heterogeneous "
                          "store needs rgcn or rgat")
    if cfg.name == "mlp":
        if not schema.node_types[schema.type_id(schema.target)].features:
            raise ConfigError(f"model.name: mlp needs features on the target type {schema.target!r}")
        return TargetLinear(schema, feat_dim, num_classes)
    if cfg.name not in ("rgcn", "rgat"):
        raise ConfigError(f"model.name: {cfg.name!r} is a homogeneous model; this store is heterogeneous "
                          f"({len(schema.node_types)} node types, {len(schema.relations)} relations): use "
                          "rgcn, rgat or mlp, or preprocess with --flatten for a homogeneous model")
    return RelationalGNN(cfg, schema, feat_dim, num_classes, every_type)
