"""The .npz format of the heterophilous-graph benchmark (roman-empire, tolokers, ...)."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from gnnssd.storage_format import DatasetError

from .base import InMemoryTables, require_file

KEYS = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")


class HeterophilousSource(InMemoryTables):
    """Edges are listed once per undirected edge (made symmetric by the store); the file
    holds ten standard splits as (10, N) masks, of which `split` picks one.
    """

    symmetric = True

    def __init__(self, path: str | Path, split: int = 0):
        self.path = require_file(Path(path))
        self.name = self.path.stem
        self.split = split
        try:
            with np.load(self.path) as data:
                missing = [k for k in KEYS if k not in data.files]
                if missing:
                    raise DatasetError(f"{self.path}: missing arrays {missing}; has {data.files}")
                arrays = {k: data[k] for k in KEYS}
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise DatasetError(f"{self.path}: not a readable .npz file ({exc})") from exc
        self._features = arrays["node_features"]
        if self._features.ndim != 2:
            raise DatasetError(f"{self.path}: node_features has shape {self._features.shape}, "
                               "expected (nodes, dim)")
        self.num_nodes, self.feat_dim = self._features.shape
        self._labels = arrays["node_labels"]
        self._edges = arrays["edges"]
        if self._edges.ndim != 2 or self._edges.shape[1] != 2:
            raise DatasetError(f"{self.path}: edges has shape {self._edges.shape}, expected (E, 2)")
        self._splits = {}
        for name, key in (("train", "train_masks"), ("valid", "val_masks"), ("test", "test_masks")):
            masks = arrays[key]
            if masks.ndim != 2 or masks.shape[1] != self.num_nodes:
                raise DatasetError(f"{self.path}: {key} has shape {masks.shape}, expected "
                                   f"(splits, {self.num_nodes})")
            if not 0 <= split < masks.shape[0]:
                raise DatasetError(f"{self.path}: split {split} requested, file has splits "
                                   f"0..{masks.shape[0] - 1}")
            self._splits[name] = np.flatnonzero(masks[split])

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        return self._edges[:, 0], self._edges[:, 1]

    def input_paths(self) -> list[Path]:
        return [self.path]

    def describe(self) -> dict[str, Any]:
        return {"kind": "npz", "file": self.path.name, "split": self.split}
