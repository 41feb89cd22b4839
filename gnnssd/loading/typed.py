"""Heterogeneous graphs on the loaders' side: the per-type views of one global ID space.

A typed store numbers all nodes globally, each type a contiguous range (see
storage_format.schema); users and DGL speak per-type IDs. These helpers convert between
the two at the loaders' edges: seeds in, `MiniBatch` out (input_nodes, output_nodes and
x as dicts by node type, as DGL's DataLoader gives them for a heterograph).
"""
from __future__ import annotations

from typing import Any

import dgl
import numpy as np
import torch

from gnnssd.sampler import MFGs, to_dgl_blocks, typed_dgl_blocks
from gnnssd.storage_format import GraphSchema, Store


def sampler_options(store: Store, etypes: np.ndarray | None = None) -> dict[str, Any]:
    """gnnssd.sampler.NeighborSampler's options for a typed store (none for a homogeneous
    one): the relation of every edge (`etypes`, default the store's mapped array), the
    relations' count, and the rows that have features."""
    if store.etypes is None:
        return {}
    return {"etypes": store.etypes if etypes is None else etypes, "num_relations": len(store.schema.relations),
            "feature_rows": store.feature_rows}


def batch_parts(mfgs: MFGs, schema: GraphSchema, rows: torch.Tensor) -> dict[str, Any]:
    """input_nodes, output_nodes, blocks and x of the sampled `mfgs` (rows: the float32
    features of mfgs.input_rows), for a MiniBatch: what every backend that samples with
    gnnssd's sampler hands out (per node type on a typed store)."""
    if schema.is_homogeneous:
        return {"input_nodes": torch.from_numpy(mfgs.input_nodes), "output_nodes": torch.from_numpy(mfgs.seeds),
                "blocks": to_dgl_blocks(mfgs), "x": rows}
    blocks = typed_dgl_blocks(mfgs, schema)
    inputs = dict(blocks[0].srcdata[dgl.NID])
    outputs = {name: ids for name, ids in blocks[-1].dstdata[dgl.NID].items() if len(ids)}
    types = schema.type_of(mfgs.input_rows)
    x = {}
    for t, node_type in enumerate(schema.node_types):
        if node_type.features:  # at the type's own width (rows are padded to the widest)
            x[node_type.name] = rows[torch.from_numpy(np.flatnonzero(types == t)), :node_type.dim]
    return {"input_nodes": inputs, "output_nodes": outputs, "blocks": blocks, "x": x}
