"""The one interface every reader and cache of feature rows offers (as GraphBolt's
`Feature.read(ids)`): rows by ID. A cache is a row source wrapping another, its fallback,
which it asks for the rows it does not hold: the hot cache (pipeline.hot_cache) around the
SSD reader (pipeline.feature_file), the per-row baseline's LRU (gnnssd.loading.backends.baselines) around
page reads, layer-wise inference's inputs (gnnssd.inference.rows) around either."""
from __future__ import annotations

from typing import Protocol

import numpy as np


class RowSource(Protocol):
    """Rows of `feat_dim` values of `dtype` (`row_bytes` each) by row ID."""

    feat_dim: int
    dtype: np.dtype
    row_bytes: int

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (int64, any order, repeats allowed) as a new (len(ids), feat_dim)
        array of `dtype`: out[k] is row ids[k]."""
        ...
