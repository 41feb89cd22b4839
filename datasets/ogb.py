"""The raw on-disk layout of OGB node-property-prediction datasets (ogbn-*).

    ROOT/raw/edge.csv.gz          one "src,dst" line per edge
    ROOT/raw/node-feat.csv.gz     one line of comma-separated floats per node
    ROOT/raw/node-label.csv.gz    one label per line (empty or nan: unlabelled)
    ROOT/raw/num-node-list.csv.gz the node count (optional)
    ROOT/split/NAME/{train,valid,test}.csv.gz  node IDs, one per line

Features are streamed through pandas in chunks, never held whole. The binary layout
(raw/data.npz, as ogbn-papers100M ships) is read by `ogb_binary.OGBBinarySource`;
`ogb_source` picks the reader by what ROOT holds. The split folders both read are
`ogb_layout`'s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from gnnssd.storage_format import DatasetError

from .base import require_file
from .ogb_binary import OGBBinarySource
from .ogb_layout import read_column, read_splits, resolve_split_name


def ogb_source(root: str | Path, split_name: str | None = None, symmetric: bool = False) -> Any:
    """The reader for the OGB layout ROOT holds: binary if raw/data.npz is there, else CSV."""
    if (Path(root) / "raw" / "data.npz").exists():
        return OGBBinarySource(root, split_name, symmetric)
    return OGBSource(root, split_name, symmetric)


def checked_labels(path: Path) -> np.ndarray:
    """One label per line as float64 (NaN, -1: unlabelled), refused naming the line when a
    value is no class number."""
    labels = read_column(path, np.float64)
    given = labels[~np.isnan(labels)]
    bad = np.flatnonzero((given != np.round(given)) | (given < -1) | (given >= 2**31))
    if bad.size:
        line = int(np.flatnonzero(~np.isnan(labels))[bad[0]]) + 1
        raise DatasetError(f"{path}: line {line} holds label {given[bad[0]]!r}, expected a class "
                           "number 0..2^31-1 (-1 or NaN: unlabelled)")
    return labels


def csv_edges(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of a "src,dst" per line CSV."""
    try:
        frame = pd.read_csv(path, header=None, dtype=np.int64)
    except (ValueError, OverflowError, OSError, EOFError, pd.errors.ParserError) as exc:
        raise DatasetError(f"{path}: cannot parse as 'src,dst' integer lines ({exc})") from exc
    if frame.shape[1] != 2:
        raise DatasetError(f"{path}: {frame.shape[1]} columns, expected 2 (src,dst)")
    return frame[0].to_numpy(), frame[1].to_numpy()


def csv_feature_dim(path: Path) -> int:
    """The number of values on the first line of a feature CSV."""
    return pd.read_csv(path, header=None, nrows=1).shape[1]


def csv_feature_chunks(path: Path, feat_dim: int, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
    """Feature rows of a one-row-per-line CSV from `start_row`, `chunk_rows` at a time; a
    short line or a missing value is named with its line and column."""
    try:
        reader = pd.read_csv(path, header=None, dtype=np.float32, chunksize=chunk_rows,
                             skiprows=start_row)
        row = start_row
        for frame in reader:
            rows = frame.to_numpy()
            missing = np.isnan(rows)
            if missing.any():  # a short line's missing fields, an empty field or "nan"
                at, column = np.argwhere(missing)[0]
                raise DatasetError(
                    f"{path}: line {row + at + 1} has no number in column {column + 1} (it has "
                    f"{int((~missing[at]).sum())} of the {feat_dim} values a feature row needs)")
            row += len(rows)
            yield rows
    except (ValueError, OverflowError, OSError, EOFError, pd.errors.ParserError) as exc:
        raise DatasetError(f"{path}: cannot parse feature rows ({exc})") from exc


class OGBSource:
    def __init__(self, root: str | Path, split_name: str | None = None, symmetric: bool = False):
        self.root = Path(root)
        self.name = self.root.name
        self.symmetric = symmetric
        self.split_name = resolve_split_name(self.root, split_name)
        self._labels = checked_labels(self._raw("node-label.csv.gz"))
        self.num_nodes = self._labels.shape[0]
        counts = self.root / "raw" / "num-node-list.csv.gz"
        if counts.exists():
            declared = int(read_column(counts, np.int64).sum())
            if declared != self.num_nodes:
                raise DatasetError(f"{counts}: {declared} nodes, but {self._raw('node-label.csv.gz')}"
                                   f" has {self.num_nodes} lines")
        self.feat_dim = csv_feature_dim(self._raw("node-feat.csv.gz"))

    def _raw(self, name: str) -> Path:
        return require_file(self.root / "raw" / name)

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        return csv_edges(self._raw("edge.csv.gz"))

    def load_labels(self) -> np.ndarray:
        return self._labels

    def load_splits(self) -> dict[str, np.ndarray]:
        return read_splits(self.root, self.split_name)

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        return csv_feature_chunks(self._raw("node-feat.csv.gz"), self.feat_dim, start_row, chunk_rows)

    def input_paths(self) -> list[Path]:
        return [self.root]

    def describe(self) -> dict[str, Any]:
        return {"kind": "ogb", "name": self.name, "split": self.split_name,
                "symmetric": self.symmetric}
