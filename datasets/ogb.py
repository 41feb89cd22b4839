"""The raw on-disk layout of OGB node-property-prediction datasets (ogbn-*).

    ROOT/raw/edge.csv.gz          one "src,dst" line per edge
    ROOT/raw/node-feat.csv.gz     one line of comma-separated floats per node
    ROOT/raw/node-label.csv.gz    one label per line (empty or nan: unlabelled)
    ROOT/raw/num-node-list.csv.gz the node count (optional)
    ROOT/split/NAME/{train,valid,test}.csv.gz  node IDs, one per line

Features are streamed through pandas in chunks, never held whole.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from gnnssd.storage_format import DatasetError

from .base import require_file


class OGBSource:
    def __init__(self, root: str | Path, split_name: str | None = None, symmetric: bool = False):
        self.root = Path(root)
        self.name = self.root.name
        self.symmetric = symmetric
        split_root = self.root / "split"
        if split_name is None:
            names = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
            if len(names) != 1:
                raise DatasetError(f"{split_root}: expected one split directory, found {names}; "
                                   "name one with --split-name")
            split_name = names[0]
        self.split_name = split_name
        self._labels = self._read_column(self._raw("node-label.csv.gz"), np.float64)
        self.num_nodes = self._labels.shape[0]
        counts = self.root / "raw" / "num-node-list.csv.gz"
        if counts.exists():
            declared = int(self._read_column(counts, np.int64).sum())
            if declared != self.num_nodes:
                raise DatasetError(f"{counts}: {declared} nodes, but {self._raw('node-label.csv.gz')}"
                                   f" has {self.num_nodes} lines")
        first = pd.read_csv(self._raw("node-feat.csv.gz"), header=None, nrows=1)
        self.feat_dim = first.shape[1]

    def _raw(self, name: str) -> Path:
        return require_file(self.root / "raw" / name)

    @staticmethod
    def _read_column(path: Path, dtype: Any) -> np.ndarray:
        try:
            frame = pd.read_csv(path, header=None, dtype=dtype)
        except (ValueError, OSError, EOFError, pd.errors.ParserError) as exc:
            raise DatasetError(f"{path}: cannot parse as one number per line ({exc})") from exc
        if frame.shape[1] != 1:
            raise DatasetError(f"{path}: {frame.shape[1]} columns, expected 1")
        return frame[0].to_numpy()

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        path = self._raw("edge.csv.gz")
        try:
            frame = pd.read_csv(path, header=None, dtype=np.int64)
        except (ValueError, OSError, EOFError, pd.errors.ParserError) as exc:
            raise DatasetError(f"{path}: cannot parse as 'src,dst' integer lines ({exc})") from exc
        if frame.shape[1] != 2:
            raise DatasetError(f"{path}: {frame.shape[1]} columns, expected 2 (src,dst)")
        return frame[0].to_numpy(), frame[1].to_numpy()

    def load_labels(self) -> np.ndarray:
        return self._labels

    def load_splits(self) -> dict[str, np.ndarray]:
        folder = self.root / "split" / self.split_name
        return {name: self._read_column(require_file(folder / f"{name}.csv.gz"), np.int64)
                for name in ("train", "valid", "test")}

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        path = self._raw("node-feat.csv.gz")
        try:
            reader = pd.read_csv(path, header=None, dtype=np.float32, chunksize=chunk_rows,
                                 skiprows=start_row)
            for frame in reader:
                yield frame.to_numpy()
        except (ValueError, OSError, EOFError, pd.errors.ParserError) as exc:
            raise DatasetError(f"{path}: cannot parse feature rows ({exc})") from exc

    def input_paths(self) -> list[Path]:
        return [self.root]

    def describe(self) -> dict[str, Any]:
        return {"kind": "ogb", "name": self.name, "split": self.split_name,
                "symmetric": self.symmetric}
