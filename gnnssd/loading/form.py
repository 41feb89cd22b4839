"""The model's form of a graph, chosen in one place.

gnnssd holds every graph in one shape: node types are ranges of one ID space and edge
types an array (empty for one relation), so the sampler, the planner and the store never
ask which kind of graph they hold. DGL has two forms for a model: plain blocks with
tensors (one node type, one relation), and typed (heterogeneous) blocks with input_nodes,
output_nodes and x as dicts by node type, as DGL's DataLoader gives them for a
heterograph. `typed_form` is the one function that chooses; `block_form` gives the blocks
of each form (DGL's, and the compiler's CSC blocks); `by_type` reads nodes or edges
given in either form; `batch_parts` builds a mini-batch's parts in that form, and
`plain_form_only` refuses a typed schema for a part that serves the plain form only
(features: device, gnnssd.layerwise). MiniBatch carries the choice (`MiniBatch.typed`)
instead of guessing it from its values, and asks `block_form` for its CSC blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import dgl
import numpy as np
import torch

from gnnssd.compiler import CSCBlock, TypedCSCBlock
from gnnssd.sampler import MFGs, typed_dgl_blocks
from gnnssd.sampler import to_dgl_blocks as plain_dgl_blocks
from gnnssd.storage_format import GraphSchema


@dataclass(frozen=True)
class BlockForm:
    """What each of DGL's two forms builds its blocks with: DGL blocks of sampled MFGs
    (mfgs, schema, device), the CSC block class a mini-batch's DGL blocks convert to
    (gnnssd.compiler's, for compiled layers), and its nodes (a tensor, or a dict by type)."""

    dgl_blocks: Callable[[MFGs, GraphSchema, str], list]
    csc_block: type[CSCBlock] | type[TypedCSCBlock]
    #: nodes in this form from nodes by type (by_type's): the one type's, or the dict
    nodes: Callable[[dict[Any, Any]], Any]


PLAIN = BlockForm(lambda mfgs, schema, device: plain_dgl_blocks(mfgs, device), CSCBlock,
                  lambda nodes: next(iter(nodes.values())))
TYPED = BlockForm(typed_dgl_blocks, TypedCSCBlock, lambda nodes: nodes)


def block_form(typed: bool) -> BlockForm:
    """The blocks of the form `typed` (typed_form's answer, which a MiniBatch carries)."""
    return TYPED if typed else PLAIN


def typed_form(schema: GraphSchema) -> bool:
    """Whether a model over `schema` takes DGL's typed form (heterogeneous blocks, dicts by
    node type) rather than the plain one (homogeneous blocks, tensors): typed unless the
    schema has one node type and one relation."""
    return not schema.is_homogeneous


def by_type(nodes: Any, node_type: str | None) -> dict[str | None, Any]:
    """`nodes` (or edges) by node type (relation): a dict by type as given (DGL's typed
    form), else all of `node_type`: the loaders' one question of the shape of the nodes
    and edges they are handed."""
    return nodes if isinstance(nodes, dict) else {node_type: nodes}


def plain_form_only(schema: GraphSchema, refusal: Exception) -> None:
    """Raise `refusal` (naming the caller and the way out) when `schema` takes the typed
    form: for a part that serves the plain form only."""
    if typed_form(schema):
        raise refusal


def to_dgl_blocks(mfgs: MFGs, device: str = "cpu", *, schema: GraphSchema) -> list:
    """DGLBlocks of `mfgs` in the form `schema` takes (see typed_form)."""
    return block_form(typed_form(schema)).dgl_blocks(mfgs, schema, device)


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
