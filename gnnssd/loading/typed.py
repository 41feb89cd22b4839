"""Heterogeneous graphs on the loaders' side: the per-type views of one global ID space.

A typed store numbers all nodes globally, each type a contiguous range (see
storage_format.schema); users and DGL speak per-type IDs. These helpers convert between
the two at the loaders' edges: seeds and fanouts in; the mini-batches' form out is
form.py's (`typed_form`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from gnnssd.storage_format import GraphSchema, Store


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


def sampler_options(store: Store, etypes: np.ndarray) -> dict[str, Any]:
    """gnnssd.sampler.NeighborSampler's options for `store`, one shape for every graph: the
    relation of every edge (`etypes`: the store's array or a loader's copy of it; empty on
    one relation), the relations' count, and the rows that have features (-1: every node)."""
    rows = store.feature_rows
    return {"etypes": etypes, "num_relations": len(store.schema.relations),
            "feature_rows": rows if rows < store.num_nodes else -1}
