"""Relational layers through the compiler: ``dgl.nn.HeteroGraphConv`` over compiled
per-relation layers, on a DGL heterogeneous block or a TypedCSCBlock (no DGL needed).

Each relation's layer is a compiled UDF layer (gnnssd.compiler.layers: GraphConvUDF with
norm='right' for R-GCN, GATConvUDF for R-GAT) run on the relation's slice of the block,
so its message passing lowers to the same g-SpMM / edge-softmax / attention paths as the
homogeneous layers; the results are summed per destination type, as HeteroGraphConv's
``aggregate='sum'``. The submodules are named as HeteroGraphConv's (``mods.<relation>``,
the UDF layers' parameters named as dgl.nn's), so state dicts are interchangeable.
"""
from __future__ import annotations

import dgl
import torch
from torch import nn

from gnnssd.compiler.api import CompiledLayer
from gnnssd.compiler.block import TypedCSCBlock


class HeteroGraphConvCompiled(nn.Module):
    """``HeteroGraphConv(mods, aggregate='sum')`` with `mods` compiled layers keyed by relation name."""

    def __init__(self, mods: dict[str, CompiledLayer]):
        super().__init__()
        self.mods = nn.ModuleDict(mods)

    def forward(self, block: dgl.DGLGraph | TypedCSCBlock, h: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per destination type the sum over relations into it of the relation's layer on
        (its source type's rows, its destination type's first rows). A relation without
        edges in this block is skipped: its layer (no bias) would add exactly zero, and a
        type that no edge reaches is absent from the result (the caller's zeros)."""
        outputs: dict[str, list[torch.Tensor]] = {}
        for relation in block.canonical_etypes:
            src, name, dst = relation
            if src not in h or dst not in h or block.num_edges(relation) == 0:
                continue
            pair = (h[src], h[dst][: block.num_dst_nodes(dst)])
            outputs.setdefault(dst, []).append(self.mods[name](block[relation], pair))
        return {dst: sum(found[1:], found[0]) for dst, found in outputs.items()}
