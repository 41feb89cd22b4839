"""A layer's input rows for layer-wise inference (gnnssd.inference.layerwise, gnnssd.inference.mean):
float32 rows of node IDs from a tensor in RAM, or from a row source: a features or layer
file through the ssd loader's reader, or a hot cache of its most referenced rows around it; on a
typed store one node type's rows by its own IDs (OffsetRows) or its zeros (ZeroRows)."""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import torch

from gnnssd.pipeline import HotCache, RowSource


class Rows(Protocol):
    """One layer's input: float32 rows of node IDs."""

    dim: int

    def read(self, ids: np.ndarray) -> torch.Tensor: ...


class TensorRows:
    def __init__(self, h: torch.Tensor):
        self.h, self.dim = h, int(h.shape[1])

    def read(self, ids: np.ndarray) -> torch.Tensor:
        return self.h[torch.from_numpy(ids)]


class StoredRows:
    """A layer's input from a row source (pipeline.RowSource: a features or layer file
    through the ssd loader's reader, or a hot cache around one) as float32;
    `as_float32(raw, ids)` turns stored rows into float32 (default: a plain conversion)."""

    def __init__(self, source: RowSource,
                 as_float32: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None):
        self.source, self.dim, self.row_bytes = source, source.feat_dim, source.row_bytes
        self.as_float32 = as_float32 or (lambda raw, ids: raw.astype(np.float32, copy=False))

    def read(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.as_float32(self.source.read(ids), ids))

    def cached(self, hot: np.ndarray, num_rows: int) -> StoredRows:
        """These rows with rows `hot` (of `num_rows`) held in memory by a hot cache (one
        sorted, coalesced read), the rest read per call: in-neighbour lists of power-law
        graphs name few nodes often. No rows to hold: these rows as they are."""
        return StoredRows(HotCache(self.source, hot, num_rows), self.as_float32) if len(hot) else self


class OffsetRows:
    """Rows of one node type by its own IDs from a source over the global ID space (a
    typed store's features file holds every featured type, each at its type's offset), at
    the type's own width `dim` (rows of narrower types are stored padded; default: all)."""

    def __init__(self, source: Rows, offset: int, dim: int | None = None):
        self.source, self.offset, self.dim = source, int(offset), dim or source.dim

    def read(self, ids: np.ndarray) -> torch.Tensor:
        return self.source.read(ids + self.offset)[:, :self.dim]


class ZeroRows:
    """A featureless node type's input when it enters as zeros: nothing stored, nothing read."""

    def __init__(self, dim: int):
        self.dim = dim

    def read(self, ids: np.ndarray) -> torch.Tensor:
        return torch.zeros(len(ids), self.dim)
