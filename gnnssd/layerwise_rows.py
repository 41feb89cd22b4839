"""A layer's input rows for layer-wise inference (gnnssd.layerwise, gnnssd.layerwise_mean):
float32 rows of node IDs from a tensor in RAM, from a features file through the ssd
loader's reader, or from such a file with its most referenced rows held in memory; on a
typed store one node type's rows by its own IDs (OffsetRows) or its zeros (ZeroRows)."""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import torch

from gnnssd.sampler import plan_extents

from .pipeline import FeatureFile


class Rows(Protocol):
    """One layer's input: float32 rows of node IDs."""

    dim: int

    def rows(self, ids: np.ndarray) -> torch.Tensor: ...


class TensorRows:
    def __init__(self, h: torch.Tensor):
        self.h, self.dim = h, int(h.shape[1])

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        return self.h[torch.from_numpy(ids)]


class FileRows:
    """A layer's input rows from a features file through the ssd loader's reader
    (pipeline.FeatureFile), by extents the read planner merges with the drive's cost model;
    `as_float32(raw, ids)` turns stored rows into float32 (default: a plain conversion)."""

    def __init__(self, source: FeatureFile,
                 as_float32: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None):
        self.source, self.dim, self.row_bytes = source, source.feat_dim, source.row_bytes
        self.as_float32 = as_float32 or (lambda raw, ids: raw.astype(np.float32, copy=False))
        self.bytes_read = 0  # of the extents read: what the drive delivered

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        offsets, lengths, _ = plan_extents(np.sort(ids), self.row_bytes, self.source.model)
        raw = np.empty((len(ids), self.row_bytes), np.uint8)
        self.source.read(ids, raw, (offsets, lengths))
        self.bytes_read += int(np.sum(lengths))
        return torch.from_numpy(self.as_float32(raw.view(self.source.dtype), ids))

    def close(self) -> None:
        self.source.close()


class CachedRows:
    """A file's most referenced rows held in memory (one sorted, coalesced read), the
    rest read per call: in-neighbour lists of power-law graphs name few nodes often."""

    def __init__(self, source: FileRows, hot: np.ndarray, num_nodes: int):
        self.source, self.dim = source, source.dim
        self.hot = source.rows(np.sort(hot))
        self.slot = np.full(num_nodes, -1, np.int32)
        self.slot[np.sort(hot)] = np.arange(len(hot), dtype=np.int32)

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        slot = self.slot[ids]
        cached = slot >= 0
        out = torch.empty(len(ids), self.dim)
        out[torch.from_numpy(cached)] = self.hot[torch.from_numpy(slot[cached].astype(np.int64))]
        out[torch.from_numpy(~cached)] = self.source.rows(ids[~cached])
        return out


class OffsetRows:
    """Rows of one node type by its own IDs from a source over the global ID space (a
    typed store's features file holds every featured type, each at its type's offset), at
    the type's own width `dim` (rows of narrower types are stored padded; default: all)."""

    def __init__(self, source: Rows, offset: int, dim: int | None = None):
        self.source, self.offset, self.dim = source, int(offset), dim or source.dim

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        return self.source.rows(ids + self.offset)[:, :self.dim]


class ZeroRows:
    """A featureless node type's input when it enters as zeros: nothing stored, nothing read."""

    def __init__(self, dim: int):
        self.dim = dim

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        return torch.zeros(len(ids), self.dim)
