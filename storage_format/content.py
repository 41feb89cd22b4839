"""What a store's arrays must hold, beyond their checksums (which anyone can recompute):
checks for `Store.open` (dtypes, byte order, shapes, endpoints, value ranges from one
min/max pass; indptr monotone, perm and inv inverse permutations keeping each node type's
range, a typed store's edges within their relations) and the rest for `verify` (every
index in range, split IDs distinct, int8 row scales finite). Loaders index with these
arrays, so they must hold before anything reads through them."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import StoreError
from .mapping import mapped_take, released_chunks
from .schema import GraphSchema

CHUNK = 1 << 22  # elements per pass of a full check (32 MiB of int64): bounded memory


def content_error(file: Path, what: str) -> StoreError:
    return StoreError(f"{file}: {what}; the store's content is invalid (its checksums match, "
                      "so it was rewritten after preprocess): rerun `gnnssd preprocess`")


def check_integer_array(file: Path, array: np.ndarray, ndim: int) -> None:
    """A native little-endian signed integer array of `ndim` dimensions (what the kernels
    that index with it read)."""
    dtype = array.dtype
    if dtype.kind != "i" or dtype.itemsize not in (4, 8) or not dtype.isnative or array.ndim != ndim:
        raise content_error(file, f"dtype {dtype.str} with {array.ndim} dimension(s), expected "
                                  f"little-endian int32 or int64 with {ndim}")


def _chunks(length: int, *mapped: np.ndarray) -> Iterator[slice]:
    return released_chunks(length, CHUNK, *mapped)


def max_of(array: np.ndarray) -> int:
    """The largest value of a 1-D array (-1 if empty), in chunks."""
    return max((int(array[part].max()) for part in _chunks(array.shape[0], array)), default=-1)


def check_range(file: Path, array: np.ndarray, lo: int, hi: int, what: str) -> None:
    """Every value in lo..hi-1 (one min/max pass, chunked)."""
    flat = array.reshape(-1)
    for part in _chunks(flat.shape[0], array):
        chunk = flat[part]
        low, high = int(chunk.min()), int(chunk.max())
        if low < lo or high >= hi:
            bad = low if low < lo else high
            at = part.start + int(np.flatnonzero(chunk == bad)[0])
            raise content_error(file, f"entry {at} is {bad}, expected {what} in {lo}..{hi - 1}")


def check_indptr_ends(file: Path, indptr: np.ndarray, num_edges: int) -> None:
    if int(indptr[0]) != 0 or int(indptr[-1]) != num_edges:
        raise content_error(file, f"starts at {int(indptr[0])} and ends at {int(indptr[-1])}, "
                                  f"expected 0 and num_edges {num_edges}")


def check_indptr_monotone(file: Path, indptr: np.ndarray) -> None:
    for part in _chunks(indptr.shape[0] - 1, indptr):
        steps = np.diff(indptr[part.start:part.stop + 1])
        if steps.size and int(steps.min()) < 0:
            at = part.start + int(np.argmax(steps < 0))
            raise content_error(file, f"decreases at node {at} ({int(indptr[at])} then "
                                      f"{int(indptr[at + 1])}), expected non-decreasing offsets")


def check_inverse(perm_file: Path, perm: np.ndarray, inv: np.ndarray) -> None:
    """inv[perm[i]] == i for every i (perm and inv in range already): both permutations.
    inv is looked up window by window (a chunk of a random perm touches every page of inv:
    0.85 GiB resident at 10^8 nodes, in every process opening the store)."""
    for part in _chunks(perm.shape[0], perm, inv):
        back = mapped_take(inv, np.asarray(perm[part]))
        wrong = np.flatnonzero(back != np.arange(part.start, part.stop))
        if wrong.size:
            i = part.start + int(wrong[0])
            raise content_error(perm_file, f"perm[{i}] = {int(perm[i])} but inv[{int(perm[i])}] = "
                                           f"{int(back[wrong[0]])}, expected perm and inv to be "
                                           "inverse permutations")


def check_distinct(file: Path, ids: np.ndarray) -> None:
    unique = np.unique(ids)
    if unique.size != ids.size:
        raise content_error(file, f"{ids.size - unique.size} repeated node ID(s), expected "
                                  "distinct IDs")


def check_finite(file: Path, values: np.ndarray) -> None:
    bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
    if bad.size:
        raise content_error(file, f"row {int(bad[0])} holds {values[bad[0]].tolist()}, expected "
                                  "finite scale and offset")


def check_within_types(file: Path, perm: np.ndarray, schema: GraphSchema) -> None:
    """perm maps each node type's range of store IDs onto itself (the store's per-type IDs
    are the dataset's only then)."""
    for part in _chunks(perm.shape[0], perm):
        store_type = schema.type_of(np.arange(part.start, part.stop))
        wrong = np.flatnonzero(schema.type_of(np.asarray(perm[part])) != store_type)
        if wrong.size:
            i = part.start + int(wrong[0])
            raise content_error(file, f"perm[{i}] = {int(perm[i])}: store ID {i} is a "
                                      f"{schema.type_names[store_type[wrong[0]]]!r} node, its dataset ID "
                                      "another type's; a node order keeps each type's range")


def check_typed_edges(file: Path, indptr: np.ndarray, indices: np.ndarray, etypes: np.ndarray,
                      schema: GraphSchema) -> None:
    """Every node's in-edges grouped by relation in order, and each edge's ends of its
    relation's source and destination types (what the typed sampler relies on: a wrong
    relation would sample another type's rows without a word), in chunks of nodes whose
    mapped pages are released after each."""
    rel_src = np.array([schema.type_id(s) for s, _, _ in schema.relations], np.int64)
    rel_dst = np.array([schema.type_id(d) for _, _, d in schema.relations], np.int64)
    from . import kernels  # numba, loaded on the first typed-edge check

    for part in _chunks(indptr.shape[0] - 1, indices, etypes):
        edge, why = kernels.first_mistyped_edge(np.asarray(indptr), np.asarray(indices), np.asarray(etypes),
                                         schema.offsets, rel_src, rel_dst, part.start, part.stop)
        if edge >= 0:
            break
    else:
        return
    relation = schema.relations[int(etypes[edge])]
    what = ("is out of relation order in its node's in-edges", "has a source of another type",
            "has a destination of another type")[why]
    raise content_error(file, f"edge {edge} (relation {'-'.join(relation)}) {what}")
