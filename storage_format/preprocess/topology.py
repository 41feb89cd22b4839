"""The store's topology: the CSC in the source's node order (in memory, or sorted out of
core when the edges exceed --memory-limit), the node order over it, and the CSC renumbered
into that order; the link split's held-out edges left out. Each step is recorded once
durable in the partial folder, so a resumed run skips the finished ones."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .checksums import _maps, _save_array
from .csc import csc_from_edges, index_dtype, renumber_csc_to_file, renumber_key_dtype
from .csc_external import BUCKET_IDS_PER_EDGE, external_csc
from ..errors import DatasetError
from .input_checks import _checked_edges
from ..link_split import (LinkSplit, checked_link_split, held_out_mask, random_link_split,
                         relation_link_split, split_relation)
from ..manifest import ETYPES
from .order import Permutation, order_name, resolve_order
from .progress import record, state_of
from ..schema import ONE_RELATION, GraphSchema
from .source import DatasetSource, edge_chunks, edge_count, schema_of
from .steps import RUNTIME_BYTES, _step, spare_memory
from .typed_csc import checked_relation_edges, typed_csc, typed_csc_to_files

log = logging.getLogger(__name__)
Notify = Callable[[str, int, int], None]

#: Edges per chunk streamed into the out-of-core topology build.
CHUNK_EDGES = 1 << 20
#: The smallest bucket of the out-of-core topology build, whatever the memory limit.
MIN_BUCKET_EDGES = 1 << 16
#: Topology files of unfinished steps, in the partial folder (gone from a finished store).
CSC_INDPTR, CSC_INDICES, CSC_ETYPES = "csc.indptr.npy", "csc.indices.npy", "csc.etypes.npy"
ORDER_PERM, STORE_INDPTR = "order.perm.npy", "topology.indptr.npy"
TOPOLOGY_STAGING = (CSC_INDPTR, CSC_INDICES, CSC_ETYPES, ORDER_PERM, STORE_INDPTR)
#: Edges renumbered per chunk when the topology is laid out in the store's order.
RENUMBER_CHUNK_EDGES = 1 << 26


def _store_topology(partial: Path, source: DatasetSource, order: str | Permutation,
                    train_idx: np.ndarray, link: LinkSplit | None, limit: int,
                    notify: Notify, steps: dict[str, dict[str, float]],
                    parts: TopologyParts) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(order name, perm, inv, indptr, indices) of the store: the CSC in the source's
    order, the node order over it, and the CSC renumbered into that order (out of core,
    as indices.npy of the partial folder). Each step is recorded once durable, so a
    resumed run skips the finished ones."""
    name = order_name(order)
    if not state_of(partial, "renumber")["done"]:
        with _step(steps, "topology"):
            indptr, indices = _resumable_csc(partial, source, link, limit, notify, parts)
        etypes = parts.staged_etypes(partial)
        with _step(steps, "order"):
            perm = _resumable_order(partial, order, indptr, indices, train_idx, parts.type_offsets)
        with _step(steps, "renumber"):
            _renumber(partial, name, indptr, indices, etypes, parts, perm, limit, notify)
        del indptr, indices, etypes
    dtype = index_dtype(source.num_nodes)
    perm = np.arange(source.num_nodes, dtype=dtype) if name == "original" else np.load(partial / ORDER_PERM)
    perm = perm.astype(dtype, copy=False)
    return (name, perm, _inverse(perm, dtype), np.load(partial / STORE_INDPTR),
            np.load(partial / "indices.npy", mmap_mode="r"))


@dataclass(frozen=True)
class TopologyParts:
    """How the topology steps build a graph of its kind: a typed graph's CSC comes with
    the relation of every edge (staged as CSC_ETYPES, stored as etypes.npy), its order keeps
    the node types apart and its edge split is of one relation; a homogeneous graph's has
    none of these. The writer chooses (schema_parts, preprocess's one question of the
    kind); the steps receive them."""
    #: (indptr, indices) of the CSC in the source's order, a typed graph's relations staged
    csc: Callable[[Path, DatasetSource, LinkSplit | None, int, Notify], tuple[np.ndarray, np.ndarray]]
    #: the edge split drawn from the edges (the source, the fractions, the split's request)
    link_split: Callable[[DatasetSource, tuple[float, float, float], dict[str, Any]], LinkSplit]
    #: the node types' offsets an order keeps apart (None: one type)
    type_offsets: np.ndarray | None
    #: the staged files the store keeps as they are when the order is the original's
    kept_files: tuple[tuple[str, str], ...]
    #: the relation of every staged edge (ONE_RELATION for one relation), from the partial folder
    staged_etypes: Callable[[Path], np.ndarray]
    #: where the renumbering writes the store's etypes (None: no etypes file)
    etypes_out: Callable[[Path], Path | None]


def plain_topology() -> TopologyParts:
    """A homogeneous graph's topology parts: one type, one relation, no etypes file."""
    return TopologyParts(_plain_csc, _random_link_split, None, ((CSC_INDICES, "indices.npy"),),
                         lambda partial: ONE_RELATION, lambda partial: None)


def typed_topology(schema: GraphSchema) -> TopologyParts:
    """A typed graph's topology parts: the types kept apart, the relations stored beside."""
    return TopologyParts(_typed_csc_staged, _relation_link_split, schema.offsets,
                         ((CSC_INDICES, "indices.npy"), (CSC_ETYPES, f"{ETYPES}.npy")),
                         lambda partial: np.load(partial / CSC_ETYPES, mmap_mode="r"),
                         lambda partial: partial / f"{ETYPES}.npy")


def _inverse(perm: np.ndarray, dtype: np.dtype = np.dtype(np.int64)) -> np.ndarray:
    inv = np.empty(perm.shape[0], dtype=dtype)
    inv[perm] = np.arange(perm.shape[0], dtype=dtype)
    return inv


def _resumable_csc(partial: Path, source: DatasetSource, link: LinkSplit | None, limit: int,
                   notify: Notify, parts: TopologyParts) -> tuple[np.ndarray, np.ndarray]:
    """The CSC in the source's node order (indices mapped from the partial folder)."""
    if not state_of(partial, "csc")["done"]:
        indptr, indices = parts.csc(partial, source, link, limit, notify)
        if not _maps(indices, partial / CSC_INDICES):
            _save_array(partial / CSC_INDICES, indices)
        _save_array(partial / CSC_INDPTR, indptr)
        record(partial, "csc", {"done": 1, "edges": int(indices.shape[0])})
    return np.load(partial / CSC_INDPTR), np.load(partial / CSC_INDICES, mmap_mode="r")


def _resumable_order(partial: Path, order: str | Permutation, indptr: np.ndarray, indices: np.ndarray,
                     train_idx: np.ndarray, type_offsets: np.ndarray | None) -> np.ndarray:
    """perm of the node order (saved unless it is the original's identity); with
    `type_offsets` (a typed graph) kept within each node type."""
    if order_name(order) == "original":
        return resolve_order(order, indptr, indices, train_idx)[1]
    if not state_of(partial, "order")["done"]:
        _save_array(partial / ORDER_PERM, resolve_order(order, indptr, indices, train_idx, type_offsets)[1])
        record(partial, "order", {"done": 1})
    return np.load(partial / ORDER_PERM)


def _renumber(partial: Path, order: str, indptr: np.ndarray, indices: np.ndarray, etypes: np.ndarray,
              parts: TopologyParts, perm: np.ndarray, limit: int, notify: Notify) -> None:
    """Write the topology in store order: indices.npy (and a typed graph's etypes.npy) in
    the partial folder, renumbered out of core (each row sorted by relation, then source),
    or the source-order files linked when the order is the original."""
    final, etypes_out = partial / "indices.npy", parts.etypes_out(partial)
    for path in (final, partial / f"{ETYPES}.npy"):
        path.unlink(missing_ok=True)  # from an earlier attempt at this step
    if order == "original":
        new_indptr = indptr
        for staged, stored in parts.kept_files:
            os.link(partial / staged, partial / stored)
    else:
        # pass 1 holds a chunk and the old pages it mapped; pass 2 a window and its file;
        # beside them the new indptr (node-sized, made inside) is counted here. A typed
        # graph's windows hold int64 keys (relation, source).
        spare = spare_memory(limit) - indptr.nbytes
        value_bytes = renumber_key_dtype(indices, etypes_out).itemsize
        chunk = min(RENUMBER_CHUNK_EDGES, max(1 << 16, spare // (4 * value_bytes)))
        new_indptr, _ = renumber_csc_to_file(indptr, indices, perm, _inverse(perm, indices.dtype), final, chunk,
                                             lambda done, total: notify("renumber", done, total),
                                             etypes, etypes_out)
    _save_array(partial / STORE_INDPTR, new_indptr)
    record(partial, "renumber", {"done": 1})
    for staged in (CSC_INDICES, CSC_ETYPES):
        (partial / staged).unlink(missing_ok=True)


def _plain_csc(partial: Path, source: DatasetSource, link: LinkSplit | None, limit: int,
               notify: Notify) -> tuple[np.ndarray, np.ndarray]:
    """A homogeneous graph's CSC: checked and built in memory or out of core without a
    link split, in memory without its held-out edges with one."""
    if link is None:
        return _checked_csc(source, limit, partial, notify)
    return _csc_without_held_out(source, link)


def _typed_csc_staged(partial: Path, source: DatasetSource, link: LinkSplit | None, limit: int,
                      notify: Notify) -> tuple[np.ndarray, np.ndarray]:
    """A typed graph's CSC (_typed_topology), its edges' relations staged as CSC_ETYPES."""
    indptr, indices, etypes = _typed_topology(partial, source, limit, notify, link, partial / CSC_INDICES)
    if not _maps(etypes, partial / CSC_ETYPES):
        _save_array(partial / CSC_ETYPES, etypes)
    return indptr, indices


def _typed_topology(partial: Path, source: DatasetSource, limit: int, notify: Notify,
                    link: LinkSplit | None, indices_path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """typed_csc in memory when its arrays fit `limit` (or the source does not say how
    many edges it has), else built out of core relation by relation (typed_csc_to_files:
    the same arrays, indices written to `indices_path` and etypes to CSC_ETYPES)."""
    schema = schema_of(source)
    n, edges = schema.num_nodes, edge_count(source)
    in_memory = (len(schema.relations) * (n + 1) * 8 + RUNTIME_BYTES
                 + (edges or 0) * (2 * index_dtype(n).itemsize + schema.etype_dtype().itemsize))
    if edges is None or in_memory <= limit:
        return typed_csc(source, notify, limit, link=link)
    log.info("%s: %d edges exceed the memory limit of %d bytes: sorting each relation out of core",
             source.name, edges, limit)

    def bucket_edges() -> int:
        """Edges a bucket may hold beside this process's memory now and a relation's indptr."""
        spare = spare_memory(limit) - 8 * (n + 1)
        return max(MIN_BUCKET_EDGES, spare // (BUCKET_IDS_PER_EDGE * index_dtype(n).itemsize))

    return typed_csc_to_files(source, notify, bucket_edges, partial / "relation-buckets", indices_path,
                              partial / CSC_ETYPES, link=link)


def _link_split(source: DatasetSource, edge_split: tuple[float, float, float] | None,
                request: dict[str, Any], parts: TopologyParts) -> LinkSplit | None:
    """The edge split: the source's own, drawn from the edges as `parts` draw it
    (`request`: the seed and negatives per evaluation edge), or none."""
    own = getattr(source, "load_link_split", None)
    if edge_split is not None and own is not None:
        raise DatasetError(f"{source.name}: the dataset has its own link split; drop --edge-split")
    if own is not None:
        return checked_link_split(own(), source.num_nodes, source.name)
    if edge_split is None:
        return None
    if request["eval_negatives"] < 1:
        raise DatasetError(f"--eval-negatives {request['eval_negatives']}: expected a positive "
                           "integer")
    return parts.link_split(source, edge_split, request)


def _relation_link_split(source: DatasetSource, edge_split: tuple[float, float, float],
                         request: dict[str, Any]) -> LinkSplit:
    """A typed graph's edge split: of the relation `request` names, negatives of its
    destination type."""
    schema = schema_of(source)
    r = split_relation(schema, request["relation"], source.name)
    t = schema.type_id(schema.relations[r][2])
    dst_nodes = (int(schema.offsets[t]), schema.node_types[t].count)
    return relation_link_split(*checked_relation_edges(source, schema, r), source.num_nodes, dst_nodes,
                               edge_split, request["seed"], request["eval_negatives"], schema.relations[r][1])


def _random_link_split(source: DatasetSource, edge_split: tuple[float, float, float],
                       request: dict[str, Any]) -> LinkSplit:
    """A homogeneous graph's edge split, of all its edges."""
    src, dst = _checked_edges(source, *source.load_edges(), first=0)
    return random_link_split(src, dst, source.num_nodes, edge_split, request["seed"],
                             request["eval_negatives"])


def _csc_without_held_out(source: DatasetSource, link: LinkSplit) -> tuple[np.ndarray, np.ndarray]:
    """The CSC of the edges minus the link split's held-out ones (in memory: the split
    masks the whole edge list)."""
    src, dst = _checked_edges(source, *source.load_edges(), first=0)
    kept = ~held_out_mask(src, dst, source.num_nodes, link)
    return csc_from_edges(src[kept], dst[kept], source.num_nodes, symmetric=source.symmetric)


def _checked_csc(source: DatasetSource, memory_limit: int, partial: Path,
                 notify: Notify) -> tuple[np.ndarray, np.ndarray]:
    """The CSC in memory when the whole edge list fits in `memory_limit`, else built out
    of core from the source's edge stream (same result, byte for byte)."""
    n = source.num_nodes
    num_edges = edge_count(source)
    ids = index_dtype(n).itemsize
    copies = 2 if source.symmetric else 1
    in_memory_bytes = (num_edges or 0) * (16 + ids * copies) + 16 * n + RUNTIME_BYTES
    if num_edges is None or in_memory_bytes <= memory_limit:
        src, dst = _checked_edges(source, *source.load_edges(), first=0)
        return csc_from_edges(src, dst, n, symmetric=source.symmetric)
    log.info("%s: %d edges exceed the memory limit of %d bytes: sorting them out of core",
             source.name, num_edges, memory_limit)

    def bucket_edges() -> int:
        """Edges a bucket may hold in what the limit leaves beside this process's memory
        now (the source's own tables, labels, ...) and indptr."""
        spare = spare_memory(memory_limit) - 8 * (n + 1)
        return max(MIN_BUCKET_EDGES, spare // (BUCKET_IDS_PER_EDGE * ids))

    def checked_chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        first = 0
        for src, dst in edge_chunks(source, CHUNK_EDGES):
            yield _checked_edges(source, src, dst, first)
            first += len(src)
        if first != num_edges:
            raise DatasetError(f"{source.name}: {first} edges streamed, {num_edges} declared")

    return external_csc(checked_chunks, n, source.symmetric, bucket_edges,
                        partial / "edge-buckets", partial / CSC_INDICES,
                        expected_edges=num_edges * copies, progress=notify)
