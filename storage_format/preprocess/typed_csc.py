"""The topology of a heterogeneous graph: one CSC over all node types plus the relation
of every edge (see storage_format.schema).

Each relation's edges become a CSC of their own (the homogeneous builder), checked against
the relation's source and destination types; the per-relation CSCs are then interleaved
node by node, so each node's in-edges are grouped by relation (in the schema's order) and
sorted by source within a relation: the sampler finds a relation's neighbours of a node
as one contiguous run. A store in another node order renumbers this CSC through window
files (csc.renumber_csc_to_file with the relations), each row sorted again by (relation,
source) in the store's IDs.

Beyond memory (`typed_csc_to_files`) each relation goes through the homogeneous
out-of-core build (csc_external: a bucketed external sort of its edges, streamed in
chunks, filtered chunk by chunk) into files of its own, and the
interleave runs a range of nodes at a time over those files, mapped: memory is one
relation's offsets, a bucket and a node range's edges, and the result is byte-identical.
"""
from __future__ import annotations

import os
import shutil
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import numba
import numpy as np

from ..atomic import atomic_write_json, writable_file
from .csc import csc_from_edges, index_dtype
from .csc_external import external_csc
from ..errors import DatasetError
from ..link_split import LinkSplit, held_out_mask
from ..mapping import npy_header, release_pages
from ..schema import GraphSchema
from ..small_files import read_small_json
from .source import TypedSource, sliced_edges

Notify = Callable[[str, int, int], None]


@numba.njit(cache=True)
def _interleave(indptrs, cat, starts, out_indptr, out_indices, out_etypes):
    """Node v's in-edges: relation 0's run, then relation 1's, ... (from `cat`, the
    relations' indices concatenated, relation r's starting at starts[r])."""
    num_rel = indptrs.shape[0]
    for v in range(out_indptr.shape[0] - 1):
        o = out_indptr[v]
        for r in range(num_rel):
            for e in range(indptrs[r, v], indptrs[r, v + 1]):
                out_indices[o] = cat[starts[r] + e]
                out_etypes[o] = r
                o += 1


def checked_relation_edges(source: TypedSource, schema: GraphSchema, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Relation r's (src, dst), checked: integer 1-D arrays of equal length whose ends
    are nodes of the relation's source and destination types (in the index dtype)."""
    return _checked_pair(source, schema, r, *(np.asarray(a) for a in source.load_relation_edges(r)))


def _checked_pair(source: TypedSource, schema: GraphSchema, r: int, src: np.ndarray, dst: np.ndarray,
                  first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """checked_relation_edges' checks on relation r's edges first.. (a chunk of them)."""
    offsets = schema.offsets
    src_type, name, dst_type = schema.relations[r]
    if src.shape != dst.shape or src.ndim != 1:
        raise DatasetError(f"{source.name}: relation {name!r} has endpoint arrays of shapes "
                           f"{src.shape} and {dst.shape}, expected two equal 1-D arrays")
    for side, ends, ntype in (("source", src, src_type), ("destination", dst, dst_type)):
        if ends.size and ends.dtype.kind not in "iu":
            raise DatasetError(f"{source.name}: relation {name!r} edge {side}s have dtype "
                               f"{ends.dtype}, expected integers")
        t = schema.type_id(ntype)
        lo, hi = offsets[t], offsets[t + 1]
        bad = np.flatnonzero((ends < lo) | (ends >= hi))
        if bad.size:
            raise DatasetError(f"{source.name}: relation {name!r} edge {first + bad[0]} has {side} "
                               f"{ends[bad[0]]}, not a {ntype!r} node ({lo}..{hi - 1})")
    dtype = index_dtype(schema.num_nodes)
    return src.astype(dtype, copy=False), dst.astype(dtype, copy=False)


def _relation_stream(source: TypedSource, schema: GraphSchema,
                     r: int) -> tuple[Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]], int]:
    """(a function yielding relation r's checked edges in chunks of up to
    RELATION_CHUNK_EDGES, their count): streamed from the source when it streams the
    relation (only a chunk in memory), else sliced from the whole arrays, loaded here once."""
    if hasattr(source, "relation_edge_chunks"):
        def streamed() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            first = 0
            for chunk in source.relation_edge_chunks(r):
                for src, dst in sliced_edges(*(np.asarray(a) for a in chunk), RELATION_CHUNK_EDGES):
                    yield _checked_pair(source, schema, r, src, dst, first)
                    first += len(src)
        return streamed, int(source.relation_edge_count(r))
    src, dst = checked_relation_edges(source, schema, r)
    return partial(sliced_edges, src, dst, RELATION_CHUNK_EDGES), len(src)


def _check_fits(source: TypedSource, needed: int, memory_limit: int, what: str) -> None:
    if needed > memory_limit:
        raise DatasetError(f"{source.name}: the heterogeneous topology is built in memory ({what} "
                           f"needs about {needed / 2**30:.2f} GiB), more than --memory-limit "
                           f"{memory_limit / 2**30:.2f} GiB; raise --memory-limit (a typed topology "
                           "is not sorted out of core yet)")


def _kept(edges: tuple[np.ndarray, np.ndarray], n: int, link: LinkSplit | None) -> tuple[np.ndarray, np.ndarray]:
    """The edges minus the link split's held-out pairs (either direction), if any."""
    if link is None:
        return edges
    kept = ~held_out_mask(*edges, n, link)
    return edges[0][kept], edges[1][kept]


def typed_csc(source: TypedSource, notify: Notify, memory_limit: int | None = None,
              link: LinkSplit | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, indices, etypes) of the source's graph in its own node IDs; repeated
    edges of one relation are kept once, the same pair in two relations once per
    relation; the valid and test pairs of `link` (source IDs) are left out of every
    relation, both directions. Built in memory: refused (before the step that would pass
    it) when it needs more than `memory_limit` bytes."""
    schema = source.schema
    n = schema.num_nodes
    limit = memory_limit or np.iinfo(np.int64).max
    _check_fits(source, len(schema.relations) * (n + 1) * 8, limit, "the relations' offsets")
    indptrs = np.zeros((len(schema.relations), n + 1), np.int64)
    parts = []
    for r in range(len(schema.relations)):
        src, dst = _kept(checked_relation_edges(source, schema, r), n, link)
        indptr, indices = csc_from_edges(src, dst, n)
        del src, dst
        indptrs[r] = indptr
        parts.append(indices)
        notify("relations", r + 1, len(schema.relations))
    edges = sum(len(p) for p in parts)
    index_bytes = index_dtype(n).itemsize
    _check_fits(source, indptrs.nbytes + edges * (2 * index_bytes + schema.etype_dtype().itemsize), limit,
                f"interleaving {edges:,} edges")
    starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    cat = np.concatenate(parts)  # a schema has at least one relation
    del parts
    out_indptr = indptrs.sum(axis=0)
    out_indices = np.empty(cat.shape[0], cat.dtype)
    out_etypes = np.empty(cat.shape[0], schema.etype_dtype())
    _interleave(indptrs, cat, starts, out_indptr, out_indices, out_etypes)
    return out_indptr, out_indices, out_etypes


#: Edges of one relation streamed at a time into the out-of-core build.
RELATION_CHUNK_EDGES = 1 << 22
#: Edges interleaved at once by the out-of-core build (a range of whole nodes).
INTERLEAVE_EDGES = 1 << 24
_STATE = "typed-state.json"


def typed_csc_to_files(source: TypedSource, notify: Notify, bucket_edges: int | Callable[[], int], scratch: Path,
                       indices_path: Path, etypes_path: Path,
                       link: LinkSplit | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """typed_csc's (indptr, indices, etypes), built out of core: indices and etypes written
    to the .npy files `indices_path` and `etypes_path` and returned mapped. `scratch` holds
    each relation's CSC (recorded once complete, so a killed build resumes at the relation,
    inside one at its bucket) and is removed at the end. `bucket_edges` as external_csc's.
    A relation's edges are streamed from the source when it streams them
    (relation_edge_chunks: a chunk in memory at a time), else loaded one relation at a
    time; its sort and the interleave are out of core."""
    schema = source.schema
    n, num_rel = schema.num_nodes, len(schema.relations)
    dtype = index_dtype(n)
    scratch.mkdir(parents=True, exist_ok=True)
    done = _typed_state(scratch)
    for r in range(done, num_rel):
        edges, count = _relation_stream(source, schema, r)
        chunks = partial(_relation_chunks, edges, n, link)
        indptr, _ = external_csc(chunks, n, False, bucket_edges, scratch / f"relation-{r}",
                                 scratch / f"indices-{r}.npy", expected_edges=count, progress=notify)
        del edges, chunks
        with writable_file(scratch / f"indptr-{r}.npy", scratch) as f:
            np.save(f, indptr)
        del indptr
        _typed_record(scratch, r + 1)
        notify("relations", r + 1, num_rel)
    indptr = _interleave_files(scratch, num_rel, n, dtype, schema.etype_dtype(), indices_path, etypes_path, notify)
    shutil.rmtree(scratch, ignore_errors=True)
    return indptr, np.load(indices_path, mmap_mode="r"), np.load(etypes_path, mmap_mode="r")


def _relation_chunks(edges: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]], n: int,
                     link: LinkSplit | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """A relation's checked edge chunks with the link split's held-out pairs left out."""
    for chunk in edges():
        yield _kept(chunk, n, link)


def _typed_state(scratch: Path) -> int:
    """Relations whose CSC files are complete in `scratch`."""
    try:
        return int(read_small_json(scratch / _STATE, what="typed sort's resume record")["relations"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _typed_record(scratch: Path, relations: int) -> None:
    atomic_write_json(scratch / _STATE, {"relations": relations})


def _interleave_files(scratch: Path, num_rel: int, n: int, dtype: np.dtype, etype_dtype: np.dtype,
                      indices_path: Path, etypes_path: Path, notify: Notify) -> np.ndarray:
    """The relations' CSC files interleaved node by node (typed_csc's `_interleave`), a
    range of nodes of about INTERLEAVE_EDGES edges at a time; returns the indptr."""
    indptrs = [np.load(scratch / f"indptr-{r}.npy", mmap_mode="r") for r in range(num_rel)]
    parts = [np.load(scratch / f"indices-{r}.npy", mmap_mode="r") for r in range(num_rel)]
    out_indptr = np.zeros(n + 1, np.int64)
    for indptr in indptrs:  # each relation's offsets leave the RSS once added (node-sized each)
        out_indptr += indptr
        release_pages(indptr)
    total = int(out_indptr[-1])
    indices, etypes = (_new_npy_map(path, kind, total) for path, kind in ((indices_path, dtype),
                                                                          (etypes_path, etype_dtype)))
    lo = 0
    while lo < n:
        hi = int(min(max(np.searchsorted(out_indptr, out_indptr[lo] + INTERLEAVE_EDGES, side="right") - 1, lo + 1), n))
        local = np.stack([np.asarray(indptr[lo:hi + 1]) - indptr[lo] for indptr in indptrs])
        cat = np.concatenate([np.asarray(part[indptr[lo]:indptr[hi]]) for part, indptr in zip(parts, indptrs)])
        starts = np.concatenate([[0], np.cumsum(local[:, -1])]).astype(np.int64)
        a, b = int(out_indptr[lo]), int(out_indptr[hi])
        _interleave(local, cat, starts, out_indptr[lo:hi + 1] - a, np.asarray(indices[a:b]), np.asarray(etypes[a:b]))
        for array in (indices, etypes, *parts, *indptrs):
            release_pages(array)  # the pass's pages leave the RSS (the page cache keeps them)
        notify("interleave", hi, n)
        lo = hi
    for array in (indices, etypes):
        array.flush()
    del indices, etypes
    for path in (indices_path, etypes_path):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    return out_indptr


def _new_npy_map(path: Path, dtype: np.dtype, length: int) -> np.memmap:
    """A new 1-D .npy file of `length` items at `path` (a file of its own, atomic.writable_file),
    mapped for writing: np.lib.format.open_memmap would open the path again, following links."""
    header = npy_header(dtype, length)
    with writable_file(path, path.parent, len(header) + length * np.dtype(dtype).itemsize) as f:
        f.seek(0)
        f.write(header)
        f.flush()
        return np.memmap(f, dtype=dtype, mode="r+", offset=len(header), shape=(length,))
