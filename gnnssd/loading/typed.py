"""A store as gnnssd's sampler takes it: one shape for every graph (the relation of each
edge, empty on one relation); the mini-batches' DGL form is form.py's (`typed_form`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from gnnssd.storage_format import Store


def sampler_options(store: Store, etypes: np.ndarray) -> dict[str, Any]:
    """gnnssd.sampler.NeighborSampler's options for `store`, one shape for every graph: the
    relation of every edge (`etypes`: the store's array or a loader's copy of it; empty on
    one relation), the relations' count, and the rows that have features (-1: every node)."""
    rows = store.feature_rows
    return {"etypes": etypes, "num_relations": len(store.schema.relations),
            "feature_rows": rows if rows < store.num_nodes else -1}
