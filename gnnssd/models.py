"""The built-in GNNs: stacks of dgl.nn layers that run on sampled blocks (MFGs)."""
from __future__ import annotations

import dgl
import dgl.nn as dglnn
import torch
from torch import nn

from .config import ModelConfig


class BlockGNN(nn.Module):
    """`layers` graph convolutions; ReLU and dropout between them, none after the last."""

    def __init__(self, convs: list[nn.Module], dropout: float):
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: list[dgl.DGLGraph], x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = conv(block, h)
            if h.dim() == 3:  # GAT: (nodes, heads, dim) -> concat inner heads, average the last
                h = h.mean(1) if i == len(self.convs) - 1 else h.flatten(1)
            if i < len(self.convs) - 1:
                h = self.dropout(torch.relu(h))
        return h


def build_model(cfg: ModelConfig, in_dim: int, num_classes: int) -> BlockGNN:
    dims = [in_dim] + [cfg.hidden] * (cfg.layers - 1) + [num_classes]
    convs: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        if cfg.name == "sage":
            convs.append(dglnn.SAGEConv(d_in, d_out, "mean"))
        elif cfg.name == "gcn":
            convs.append(dglnn.GraphConv(d_in, d_out, norm="both", allow_zero_in_degree=True))
        elif cfg.name == "gat":
            # Hidden layers split `hidden` across heads so widths match the other models.
            last = i == cfg.layers - 1
            head_dim = d_out if last else max(1, d_out // cfg.heads)
            in_width = d_in if i == 0 else max(1, cfg.hidden // cfg.heads) * cfg.heads
            convs.append(dglnn.GATConv(in_width, head_dim, cfg.heads, allow_zero_in_degree=True))
        else:
            raise ValueError(f"model.name {cfg.name!r}")
    return BlockGNN(convs, cfg.dropout)
