"""Helpers shared by the dataset readers."""
from __future__ import annotations

import math
import mmap
import pickle
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError, NodeType, shown


#: The globals a pickled NumPy array names (numpy 1.x and 2.x module paths).
NUMPY_ARRAY_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
})


def bounded_numpy_global(unpickler: pickle.Unpickler, module: str, name: str, limit: int) -> Any:
    """NumPy's pickle global `module.name` (one of NUMPY_ARRAY_GLOBALS) with what it may make
    bounded: an array of at most `limit` bytes (the pickle's own size: a pickled array's data
    are in the pickle, so a larger shape is a hostile one, e.g. numpy.ndarray((2**40,)) by
    REDUCE, which asked for 8 TiB), and no dtype holding Python objects."""
    make = pickle.Unpickler.find_class(unpickler, module, name)
    if name == "dtype":
        def dtype(*args: Any) -> np.dtype:
            made = make(*args)
            if made.hasobject:
                raise pickle.UnpicklingError(f"an array dtype {made} holding Python objects; expected numbers")
            return made
        return dtype
    if name == "scalar":
        return make  # its value's bytes are in the pickle

    def array(*args: Any) -> np.ndarray:
        if name == "ndarray":
            shape, dtype = args[0], args[1] if len(args) > 1 else float
        else:  # _reconstruct(subtype, shape, dtype): the subtype as pickled is this numpy.ndarray
            args = (getattr(args[0], "wrapped", args[0]), *args[1:]) if args else args
            shape, dtype = args[1:3]
        shape = (shape,) if isinstance(shape, int) else shape
        if not (isinstance(shape, tuple) and all(isinstance(n, int) and n >= 0 for n in shape)):
            raise pickle.UnpicklingError("an array of a malformed shape")
        size = math.prod(shape) * _dtype_of(dtype).itemsize
        if size > limit:
            raise pickle.UnpicklingError(f"an array of shape {shown(shape, 100)} ({size:,} bytes) in a pickle "
                                         f"of {limit:,} bytes, which cannot hold its data")
        return make(*args)
    array.wrapped = make
    return array


def _dtype_of(value: Any) -> np.dtype:
    try:
        return np.dtype(value)
    except TypeError as exc:
        raise pickle.UnpicklingError(f"an array of dtype {shown(value, 60)} ({exc})") from None


class AllowListUnpickler(pickle.Unpickler):
    """Unpickles only the globals a format uses (`allowed`, or what `admits` accepts): a
    crafted file cannot name a function (os.system, eval, ...) to be called as it loads,
    and NumPy's globals make no array larger than the pickle's `limit` bytes
    (bounded_numpy_global). Subclasses set `allowed` and `holds` (what the format holds,
    for the refusal)."""

    allowed: frozenset[tuple[str, str]] = frozenset()
    holds = ""

    def __init__(self, file: Any, *, limit: int, **options: Any):
        super().__init__(file, **options)
        self.limit = limit

    def admits(self, module: str, name: str) -> bool:
        return False

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.allowed and not self.admits(module, name):
            raise pickle.UnpicklingError(f"refused to load {module}.{name} ({self.holds})")
        if (module, name) in NUMPY_ARRAY_GLOBALS:
            return bounded_numpy_global(self, module, name, self.limit)
        return super().find_class(module, name)


def reversed_relations(relations: list[tuple[str, str, str]], add_reverse: bool,
                       name: Callable[[str], str] = lambda r: f"rev_{r}") -> list[tuple[str, str, str]]:
    """`relations`, then (with `add_reverse`) the reverse of each in the same order, named
    `name(relation)` (DGL's MAG recipes: rev_NAME)."""
    return list(relations) + ([(d, name(r), s) for s, r, d in relations] if add_reverse else [])


def relation_edges(relation: int, forward: int,
                   load: Callable[[int], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Edges of relation `relation` of a source whose relations are `forward` ones then
    their reverses (reversed_relations): a reverse is its forward relation's pairs swapped."""
    src, dst = load(relation % forward)
    return (src, dst) if relation < forward else (dst, src)


def featured_types(counts: dict[str, int], dims: dict[str, int]) -> tuple[int, list[NodeType]]:
    """The store's feat_dim and node types for per-type feature widths `dims` (the featured
    types, first, in `counts` order; then the featureless): one width for all is the
    store's; types of different widths are stored padded to the widest (`padded_rows`),
    each keeping its own (NodeType.dim)."""
    widest = max(dims.values())
    differ = len(set(dims.values())) > 1
    return widest, ([NodeType(t, counts[t], True, dims[t] if differ else None) for t in counts if t in dims]
                    + [NodeType(t, counts[t], False) for t in counts if t not in dims])


def padded_rows(rows: np.ndarray, width: int) -> np.ndarray:
    """`rows` with zero columns appended up to `width` (as they are when already that wide)."""
    if rows.shape[1] == width:
        return rows
    out = np.zeros((rows.shape[0], width), rows.dtype)
    out[:, :rows.shape[1]] = rows
    return out


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


def load_npy(path: Path, what: str) -> np.ndarray:
    """A .npy file memory-mapped (nothing read yet), or an error naming the file."""
    try:
        array = np.load(require_file(path), mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise DatasetError(f"{path}: not a .npy array of {what} ({exc})") from exc
    if array.dtype.kind not in "biuf" or not array.dtype.isnative and array.dtype.itemsize > 1:
        raise DatasetError(f"{path}: dtype {array.dtype.str} ({what}), expected little-endian "
                           "numbers (bool, integer or float); convert it with "
                           "`array.astype(array.dtype.newbyteorder('='))`")
    return array


def mapped_edge_chunks(edges: np.ndarray, chunk_edges: int,
                       by_row: bool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) chunks of a (memory-mapped) edge array: (2, E) if `by_row` (GraphBolt),
    else (E, 2) (IGB). Each chunk of a whole-file mapping is mapped and copied on its own,
    so the pages read do not stay resident (see slice_chunks)."""
    if not edges.flags.c_contiguous:  # Fortran order: the transpose is C order
        edges, by_row = edges.T, not by_row
    if not by_row:
        for block in slice_chunks(edges, 0, chunk_edges):
            yield np.ascontiguousarray(block[:, 0]), np.ascontiguousarray(block[:, 1])
        return
    total = edges.shape[1]
    mapped = isinstance(edges, np.memmap) and isinstance(edges.base, mmap.mmap)
    for lo in range(0, total, chunk_edges):
        n = min(chunk_edges, total - lo)
        if mapped:
            yield tuple(np.array(np.memmap(edges.filename, dtype=edges.dtype, mode="r", shape=(n,),
                                           offset=edges.offset + (side * total + lo) * edges.itemsize))
                        for side in (0, 1))
        else:
            yield np.array(edges[0, lo:lo + n]), np.array(edges[1, lo:lo + n])
