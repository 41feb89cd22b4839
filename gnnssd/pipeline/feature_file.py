"""The SSD reader: rows of a features file read through gnnssd.io_engine by the read
planner's extents. It is the row source the hot cache wraps, and the mega-batch buffers
read the rows the cache does not hold through it."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnssd.pipeline.direct_io import DirectIO
from gnnssd.sampler import CostModel, plan_extents


class FeatureFile:
    """The SSD reader: rows of a features file read through the engine (O_DIRECT, page
    checksums where the DirectIO has them) by the read planner's extents, one staging
    area reused by every read (callers read from one thread at a time)."""

    def __init__(self, io: DirectIO, path: str | Path, feat_dim: int, dtype: np.dtype,
                 model: CostModel | None = None, staging_bytes: int = 32 << 20):
        self.io, self.model = io, model or CostModel.default()
        self.dtype, self.feat_dim = np.dtype(dtype), feat_dim
        self.row_bytes = feat_dim * self.dtype.itemsize
        self.file = io.open(path)
        self.staging = io.alloc(max(staging_bytes, 2 * self.model.max_extent(self.row_bytes)))
        self.bytes_read = 0  # of the extents read: what the drive delivered

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (any order), by extents the read planner merges with the drive's cost model."""
        ids = np.asarray(ids, np.int64)
        if not len(ids):  # nothing to plan (an empty hot cache: no numba kernel's start-up at open)
            return np.empty((0, self.feat_dim), self.dtype)
        offsets, lengths, _ = plan_extents(np.sort(ids), self.row_bytes, self.model)
        out = np.empty((len(ids), self.row_bytes), np.uint8)
        self.read_into(ids, out, (offsets, lengths))
        return out.view(self.dtype)

    def read_into(self, rows: np.ndarray, out: np.ndarray, extents: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """out[k] = row rows[k] (out: at least len(rows) rows of row_bytes), read by `extents`
        (rows then in any order) or by extents planned here (rows sorted)."""
        offsets, lengths = extents if extents is not None else plan_extents(rows, self.row_bytes, self.model)[:2]
        self.io.read_rows(self.file, rows, self.row_bytes, offsets, lengths, out[: len(rows)], self.staging)
        self.bytes_read += int(np.sum(lengths))

    def close(self) -> None:
        self.io.close(self.file)
