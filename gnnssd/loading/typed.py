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

from gnnssd.sampler import MFGs, typed_dgl_blocks
from gnnssd.storage_format import GraphSchema


def layer_fanouts(schema: GraphSchema, fanouts: list[Any]) -> list[Any]:
    """Fanouts as the sampler takes them: ints for a homogeneous store; for a typed one a
    tuple per layer with a fanout per relation (from one number, or a dict by relation
    name whose missing relations take none)."""
    if schema.is_homogeneous:
        if any(isinstance(f, dict) for f in fanouts):
            raise ValueError(f"fanouts {fanouts}: per-relation fanouts need a heterogeneous store; "
                             "this one has one node type and one relation")
        return list(fanouts)
    return [tuple(schema.relation_fanouts(f).tolist()) for f in fanouts]


def dgl_fanouts(schema: GraphSchema, layer: Any) -> Any:
    """One layer's fanout as DGL's NeighborSampler takes it on a heterograph."""
    if isinstance(layer, (int, np.integer)):
        return int(layer)
    return {relation: int(k) for relation, k in zip(schema.relations, layer)}


def seeds_by_type(schema: GraphSchema, store_ids: np.ndarray) -> dict[str, torch.Tensor]:
    """Global seed IDs as DGL's per-type seed dict."""
    types = schema.type_of(store_ids)
    offsets = schema.offsets
    return {schema.type_names[t]: torch.from_numpy(store_ids[types == t] - offsets[t])
            for t in np.unique(types)}


def relation_edge_ids(graph: dgl.DGLGraph, schema: GraphSchema, pairs: np.ndarray) -> dict[tuple, torch.Tensor]:
    """The edge IDs of `graph` (the store's heterograph) joining a pair of `pairs` ((E, 2)
    global IDs) in either direction, per relation: what the typed sampler excludes
    (sampler.sampling.exclusion_keys), as DGL's `exclude_eids` takes them."""
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    both = np.concatenate([pairs, pairs[:, ::-1]])
    types, offsets = schema.type_of(both.ravel()).reshape(-1, 2), schema.offsets
    out = {}
    for relation in schema.relations:
        s, d = schema.type_id(relation[0]), schema.type_id(relation[2])
        mine = both[(types[:, 0] == s) & (types[:, 1] == d)]
        u, v = torch.from_numpy(mine[:, 0] - offsets[s]), torch.from_numpy(mine[:, 1] - offsets[d])
        present = graph.has_edges_between(u, v, etype=relation)
        out[relation] = graph.edge_ids(u[present], v[present], etype=relation)
    return out


def global_ids(schema: GraphSchema, nodes: dict[str, torch.Tensor]) -> np.ndarray:
    """Per-type IDs (a dict by type) as global IDs, types in the schema's order."""
    offsets = schema.offsets
    return np.concatenate([np.asarray(nodes[name]) + offsets[t] for t, name in enumerate(schema.type_names)
                           if name in nodes] or [np.empty(0, np.int64)]).astype(np.int64)


def split_features(schema: GraphSchema, nodes: dict[str, torch.Tensor],
                   rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """x of the featured types, from `rows`: the features of their nodes in
    `global_ids(nodes)` order (featured types first), each type at its own width."""
    x, at = {}, 0
    for t in schema.node_types:
        if t.features and t.name in nodes:
            count = len(nodes[t.name])
            x[t.name] = rows[at:at + count, :t.dim]
            at += count
    return x


def typed_batch_parts(mfgs: MFGs, schema: GraphSchema, rows: torch.Tensor) -> dict[str, Any]:
    """input_nodes, output_nodes, blocks and x of the sampled `mfgs` (rows: the float32
    features of mfgs.input_rows), for a MiniBatch."""
    blocks = typed_dgl_blocks(mfgs, schema)
    inputs = dict(blocks[0].srcdata[dgl.NID])
    outputs = {name: ids for name, ids in blocks[-1].dstdata[dgl.NID].items() if len(ids)}
    types = schema.type_of(mfgs.input_rows)
    x = {}
    for t, node_type in enumerate(schema.node_types):
        if node_type.features:  # at the type's own width (rows are padded to the widest)
            x[node_type.name] = rows[torch.from_numpy(np.flatnonzero(types == t)), :node_type.dim]
    return {"input_nodes": inputs, "output_nodes": outputs, "blocks": blocks, "x": x}
