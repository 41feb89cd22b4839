"""Layer-wise inference by node type, the parts gnnssd.inference.layerwise's memory and ssd
runners share: a layer's chunks of one node type (over heterogeneous blocks on a typed store;
a homogeneous store is the one-type case, over DGL blocks) and layer 0's input rows per type.

The model's per-layer protocol on a typed store (gnnssd.models.hetero' RelationalGNN and
TargetLinear): `num_layers`, `layer(i, block, h)` with `h` and the result dicts of rows by
node type, and optionally `embeddings[type]` (learned rows of a featureless type; without
one the type enters as zeros).
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from gnnssd.loading import typed_form
from gnnssd.models import BlockGNN
from gnnssd.storage_format import GraphSchema, Store

from .blocks import chunk_block, chunk_bounds, typed_chunk_block
from .rows import OffsetRows, Rows, TensorRows, ZeroRows


def check_model_form(model: nn.Module, schema: GraphSchema) -> None:
    """Refuse a homogeneous model for a heterogeneous store before any layer runs (its
    layers take one tensor): the layer-wise passes ask the model's form of form.py."""
    if isinstance(model, BlockGNN) and typed_form(schema):
        raise TypeError("layer-wise inference on a heterogeneous store needs a model whose layer(i, block, h) "
                        "takes and returns dicts of rows by node type (gnnssd.models.hetero), not a BlockGNN")


def layer_chunks(model: nn.Module, i: int, store: Store, source: Rows,
                 bounds: list[tuple[int, int]]) -> Iterator[torch.Tensor]:
    """Layer i's output rows of a homogeneous store, chunk by chunk in store order (DGL
    blocks, `h` one tensor: gnnssd.models.builtin's protocol)."""
    indptr, indices = store.indptr, store.indices
    for lo, hi in bounds:
        block, src = chunk_block(indptr, indices, lo, hi)
        yield model.layer(i, block, source.read(src))


def layer_chunks_of_type(model: nn.Module, i: int, store: Store, inputs: dict[str, Rows], t: int,
                         budget: int) -> Iterator[torch.Tensor]:
    """Layer i's output rows of node type t, chunk by chunk in store order, from `inputs`
    (each type's input rows by type-local ID): in the model's plain form (form.py's
    typed_form) by `layer_chunks`, in the typed form over heterogeneous blocks."""
    lo, hi = (int(x) for x in store.schema.offsets[t:t + 2])
    name = store.schema.type_names[t]
    row_bytes = max(rows.dim for rows in inputs.values()) * 4
    bounds = chunk_bounds(store.indptr[lo:hi + 1], row_bytes, budget)
    if not typed_form(store.schema):
        yield from layer_chunks(model, i, store, inputs[name], bounds)
        return
    for a, b in bounds:
        block, sources = typed_chunk_block(store, lo + a, lo + b)
        out = model.layer(i, block, {n: inputs[n].read(ids) for n, ids in sources.items() if len(ids)})
        if not isinstance(out, dict):
            raise TypeError(f"layer-wise inference on a heterogeneous store: model.layer({i}, block, h) "
                            f"returned {type(out).__name__}; expected a dict of rows by node type")
        yield out[name]


def first_inputs(model: nn.Module, store: Store, features: Rows, types: list[int]) -> dict[str, Rows]:
    """Layer 0's input rows of each of node types `types` by type-local ID: a featured
    type's from `features` (the featured types' rows by store ID), a featureless type's
    learned rows (`model.embeddings[type]`) or zeros."""
    schema, embeddings = store.schema, getattr(model, "embeddings", {})
    inputs: dict[str, Rows] = {}
    for t in types:
        name = schema.type_names[t]
        if schema.node_types[t].features:
            inputs[name] = OffsetRows(features, int(schema.offsets[t]), schema.node_types[t].dim)
        elif name in embeddings:
            inputs[name] = TensorRows(embeddings[name].weight.detach())
        else:
            inputs[name] = ZeroRows(store.feat_dim)
    return inputs
