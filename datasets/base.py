"""Helpers shared by the dataset readers."""
from __future__ import annotations

import mmap
from pathlib import Path
from typing import Iterator

import numpy as np

from gnnssd.storage_format import DatasetError


def require_file(path: Path) -> Path:
    """The path of an input file that must exist and be a regular, readable file."""
    if not path.exists():
        raise DatasetError(f"{path}: missing input file")
    if not path.is_file():
        raise DatasetError(f"{path}: expected a file, found a {'directory' if path.is_dir() else 'special file'}")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise DatasetError(f"{path}: cannot be read: {exc.strerror}") from exc
    return path


def slice_chunks(array: np.ndarray, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
    """Row blocks of an in-memory or memory-mapped array, each materialised on its own.

    A whole-file np.memmap is re-mapped one chunk at a time: reading through the
    caller's mapping would leave every page it touched resident until the end.
    """
    per_chunk_map = (isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap)
                     and array.flags.c_contiguous)
    for lo in range(start_row, array.shape[0], chunk_rows):
        hi = min(lo + chunk_rows, array.shape[0])
        if per_chunk_map:
            row_bytes = array.itemsize * int(np.prod(array.shape[1:]))
            chunk = np.memmap(array.filename, dtype=array.dtype, mode="r",
                              offset=array.offset + lo * row_bytes, shape=(hi - lo, *array.shape[1:]))
            yield np.array(chunk)
            del chunk
        else:
            yield np.asarray(array[lo:hi])


class InMemoryTables:
    """The load_* and feature_chunks methods of a source whose arrays are all loaded.

    Subclasses set `_features`, `_labels` and `_splits` (and implement load_edges).
    """

    _features: np.ndarray
    _labels: np.ndarray
    _splits: dict[str, np.ndarray]

    def load_labels(self) -> np.ndarray:
        return self._labels

    def load_splits(self) -> dict[str, np.ndarray]:
        return self._splits

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        return slice_chunks(self._features, start_row, chunk_rows)
