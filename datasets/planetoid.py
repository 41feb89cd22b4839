"""Planetoid citation graphs (Cora, CiteSeer, PubMed) in their original pickle files."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from gnnssd.storage_format import DatasetError

from .base import NUMPY_ARRAY_GLOBALS, AllowListUnpickler, InMemoryTables, require_file

PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph")


class PlanetoidUnpickler(AllowListUnpickler):
    """Unpickles only what the Planetoid pickles name (modules as written in the files,
    Python 2 spellings too): NumPy arrays, SciPy CSR matrices and the graph's defaultdict
    of lists. Nothing else loads."""

    allowed = NUMPY_ARRAY_GLOBALS | {
        ("scipy.sparse.csr", "csr_matrix"), ("scipy.sparse._csr", "csr_matrix"),
        ("collections", "defaultdict"), ("collections", "OrderedDict"),
        ("__builtin__", "list"), ("__builtin__", "dict"), ("__builtin__", "set"),
        ("builtins", "list"), ("builtins", "dict"), ("builtins", "set"),
    }
    holds = "a Planetoid pickle holds only NumPy arrays, SciPy CSR matrices, lists and dicts"


class PlanetoidSource(InMemoryTables):
    """The standard Planetoid assembly: allx+tx and ally+ty stacked, test rows put back in
    `test.index` order; CiteSeer's isolated test indices get zero rows. Train = the first
    len(y) nodes, valid = the next 500, test = the nodes of `test.index`.
    """

    symmetric = True

    def __init__(self, root: str | Path, name: str, normalize: bool = True):
        self.root = Path(root)
        self.name = name
        self.normalize = normalize
        parts = {part: self._load(part) for part in PARTS}
        test_index = self._test_index()
        test_sorted = np.sort(test_index)
        tx, ty = _as_dense(parts["tx"], self._file("tx")), np.asarray(parts["ty"])
        if test_sorted.size != tx.shape[0] or test_sorted.size == 0:
            raise DatasetError(f"{self._file('test.index')}: {test_sorted.size} indices for "
                               f"{tx.shape[0]} test rows in {self._file('tx')}")
        allx = _as_dense(parts["allx"], self._file("allx"))
        span = int(test_sorted[-1]) - int(test_sorted[0]) + 1
        # Test rows follow allx's: a span past twice the test rows is a damaged index, not
        # CiteSeer's few missing rows (and would allocate span x dim zeros).
        if (test_sorted[0] != allx.shape[0] or span > 2 * tx.shape[0]
                or np.unique(test_sorted).size != test_sorted.size):
            raise DatasetError(
                f"{self._file('test.index')}: indices {int(test_sorted[0])}..{int(test_sorted[-1])}"
                f" ({test_sorted.size} distinct expected), expected distinct nodes from "
                f"{allx.shape[0]} (the rows of {self._file('allx')}) spanning at most "
                f"{2 * tx.shape[0]} (twice the test rows)")
        if span != tx.shape[0]:  # CiteSeer: some test indices have no row: zero-fill them
            full_x = np.zeros((span, tx.shape[1]), dtype=tx.dtype)
            full_y = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
            full_x[test_sorted - test_sorted[0]] = tx
            full_y[test_sorted - test_sorted[0]] = ty
            tx, ty = full_x, full_y
        features = np.vstack([allx, tx]).astype(np.float32)
        onehot = np.vstack([np.asarray(parts["ally"]), ty])
        if features.shape[0] != onehot.shape[0]:
            raise DatasetError(f"{self.root}: {features.shape[0]} feature rows but "
                               f"{onehot.shape[0]} label rows (allx+tx vs ally+ty)")
        features[test_index] = features[test_sorted]
        if normalize:  # rows sum to 1, as in the reference GCN preprocessing
            sums = features.sum(axis=1, keepdims=True)
            features /= np.where(sums == 0, 1, sums)
        onehot[test_index] = onehot[test_sorted]
        self._features = features
        self._labels = np.where(onehot.any(axis=1), onehot.argmax(axis=1), -1)
        n_train = np.asarray(parts["y"]).shape[0]
        self._splits = {"train": np.arange(n_train), "valid": np.arange(n_train, n_train + 500),
                        "test": test_sorted}
        # Nodes without a label row (CiteSeer) take class 0, as the reference assembly does.
        self._labels[self._splits["test"][self._labels[self._splits["test"]] < 0]] = 0
        self._graph = parts["graph"]
        self.num_nodes = features.shape[0]
        self.feat_dim = features.shape[1]

    def _file(self, part: str) -> Path:
        return self.root / f"ind.{self.name}.{part}"

    def _load(self, part: str) -> Any:
        path = require_file(self._file(part))
        try:
            with open(path, "rb") as f, warnings.catch_warnings():
                # The 2016 pickles name scipy.sparse.csr, which SciPy now flags as deprecated.
                warnings.simplefilter("ignore", DeprecationWarning)
                return PlanetoidUnpickler(f, encoding="latin1", limit=os.fstat(f.fileno()).st_size).load()
        except Exception as exc:  # a damaged pickle can raise almost anything
            raise DatasetError(f"{path}: not a readable Planetoid pickle ({type(exc).__name__}: "
                               f"{exc})") from exc

    def _test_index(self) -> np.ndarray:
        path = require_file(self._file("test.index"))
        try:
            return np.loadtxt(path, dtype=np.int64, ndmin=1)
        except ValueError as exc:
            raise DatasetError(f"{path}: expected one integer node index per line ({exc})") from exc

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(self._graph, dict):
            raise DatasetError(f"{self._file('graph')}: expected a dict of adjacency lists, got "
                               f"{type(self._graph).__name__}")
        src = np.fromiter((u for u, nbrs in self._graph.items() for _ in nbrs), dtype=np.int64)
        dst = np.fromiter((v for nbrs in self._graph.values() for v in nbrs), dtype=np.int64)
        return src, dst

    def input_paths(self) -> list[Path]:
        return [self.root]

    def describe(self) -> dict[str, Any]:
        return {"kind": "planetoid", "name": self.name, "root": self.root.name,
                "normalize": self.normalize}


def _as_dense(matrix: Any, path: Path) -> np.ndarray:
    """A pickled matrix as a dense array; a sparse one's indices, indptr and shape are
    checked first (SciPy's toarray trusts them: a column index past the shape crashes it)."""
    if sp.issparse(matrix):
        try:
            if not isinstance(matrix, sp.csr_matrix) or len(matrix.shape) != 2:
                raise ValueError(f"a {type(matrix).__name__}, expected a 2-D CSR matrix")
            matrix.check_format(full_check=True)
        except (ValueError, TypeError, AttributeError) as exc:
            raise DatasetError(f"{path}: a malformed sparse matrix ({exc})") from None
        return matrix.toarray()
    array = np.asarray(matrix)
    if array.ndim != 2:
        raise DatasetError(f"{path}: expected a 2-D matrix, got shape {array.shape}")
    return array
