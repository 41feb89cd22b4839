"""The model's form of a graph, chosen in one place.

gnnssd holds every graph in one shape: node types are ranges of one ID space and edge
types an array (empty for one relation), so the sampler, the planner and the store never
ask which kind of graph they hold. DGL has two forms for a model: plain blocks with
tensors (one node type, one relation), and typed (heterogeneous) blocks with input_nodes,
output_nodes and x as dicts by node type, as DGL's DataLoader gives them for a
heterograph. `typed_form` is the one function that chooses; `by_type` reads nodes given in either
form; `batch_parts` builds a
mini-batch's parts in that form, and `plain_form_only` refuses a typed schema for a part
that serves the plain form only (features: device, gnnssd.layerwise). MiniBatch carries
the choice (`MiniBatch.typed`) instead of guessing it from its values.
"""
from __future__ import annotations

from typing import Any

import dgl
import numpy as np
import torch

from gnnssd.sampler import MFGs, typed_dgl_blocks
from gnnssd.sampler import to_dgl_blocks as plain_dgl_blocks
from gnnssd.storage_format import GraphSchema


def typed_form(schema: GraphSchema) -> bool:
    """Whether a model over `schema` takes DGL's typed form (heterogeneous blocks, dicts by
    node type) rather than the plain one (homogeneous blocks, tensors): typed unless the
    schema has one node type and one relation."""
    return not schema.is_homogeneous


def by_type(nodes: Any, node_type: str | None) -> dict[str | None, Any]:
    """`nodes` by node type: a dict by type as given (DGL's typed form), else all of
    `node_type`: the loaders' one question of the shape of nodes they are handed."""
    return nodes if isinstance(nodes, dict) else {node_type: nodes}


def plain_form_only(schema: GraphSchema, refusal: Exception) -> None:
    """Raise `refusal` (naming the caller and the way out) when `schema` takes the typed
    form: for a part that serves the plain form only."""
    if typed_form(schema):
        raise refusal


def to_dgl_blocks(mfgs: MFGs, device: str = "cpu", *, schema: GraphSchema) -> list:
    """DGLBlocks of `mfgs` in the form `schema` takes (see typed_form)."""
    return typed_dgl_blocks(mfgs, schema, device) if typed_form(schema) else plain_dgl_blocks(mfgs, device)


def batch_parts(mfgs: MFGs, schema: GraphSchema, rows: torch.Tensor) -> dict[str, Any]:
    """input_nodes, output_nodes, blocks, x and typed of the sampled `mfgs` (rows: the
    float32 features of mfgs.input_rows), for a MiniBatch: what every backend that samples
    with gnnssd's sampler hands out, in the form `schema` takes (per node type when typed)."""
    blocks = to_dgl_blocks(mfgs, schema=schema)
    if not typed_form(schema):
        return {"input_nodes": torch.from_numpy(mfgs.input_nodes), "output_nodes": torch.from_numpy(mfgs.seeds),
                "blocks": blocks, "x": rows, "typed": False}
    inputs = dict(blocks[0].srcdata[dgl.NID])
    outputs = {name: ids for name, ids in blocks[-1].dstdata[dgl.NID].items() if len(ids)}
    types = schema.type_of(mfgs.input_rows)
    x = {}
    for t, node_type in enumerate(schema.node_types):
        if node_type.features:  # at the type's own width (rows are padded to the widest)
            x[node_type.name] = rows[torch.from_numpy(np.flatnonzero(types == t)), :node_type.dim]
    return {"input_nodes": inputs, "output_nodes": outputs, "blocks": blocks, "x": x, "typed": True}
