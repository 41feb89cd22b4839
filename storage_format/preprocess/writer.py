"""Writing a store from a DatasetSource: streamed, validated, atomic and resumable.

The store is built in a hidden sibling directory `.NAME.partial`, which is swapped
into place only once complete (manifest last). A preprocess that dies leaves any
previous store untouched; rerun with the same inputs and it resumes the feature
copy from the last chunk that reached the disk. This module runs the steps in order;
each job has its module: the partial directory's lifecycle (partial_dir), the input
checks (input_checks), the topology, the features, the checksums, disk space and the
steps' timing and memory (steps).
"""
from __future__ import annotations

import datetime
import importlib.metadata
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..atomic import atomic_write_json
from .checksums import _save_array, _write_page_checksums
from .csc import index_dtype
from .disk_space import DiskFullError, _check_free_space, _mib, _writing
from ..errors import DatasetError
from .features import (_checked_feature_rows, _quantize_features, _stream_features, _window_rows,
                       _written_dtype)
from .input_checks import _check_splits_in_target, _checked_labels, _checked_splits
from ..link_split import split_relation
from ..manifest import (ARRAY_FILES, ETYPES, FEATURE_DTYPES, FEATURES, FORMAT_NAME, FORMAT_VERSION,
                       MANIFEST, PAGE, PAGE_CHECKSUMS, ROW_SCALES, manifest_checksum)
from .order import Permutation, order_name
from .partial_dir import (_check_destination, _check_no_overlap, output_lock, _input_identity,
                          _open_partial_dir, _partial_dir, _restore_interrupted_swap, _swap_into_place)
from .progress import PROGRESS
from .reorder import reordered_features
from .source import DatasetSource, edge_count, schema_of
from .steps import _step, default_memory_limit, spare_memory
from .topology import TOPOLOGY_STAGING, TopologyParts, _link_split, _store_topology, plain_topology, typed_topology

log = logging.getLogger(__name__)


def write_store(out: str | Path, source: DatasetSource, order: str | Permutation = "original",
                dtype: str = "float32", progress: Callable[[str, int, int], None] | None = None,
                memory_limit: int | None = None,
                edge_split: tuple[float, float, float] | None = None, split_seed: int = 0,
                eval_negatives: int = 1000, edge_split_relation: str | None = None) -> Path:
    """Preprocess `source` into the store directory `out`; returns its path. `order`:
    "original", or a Permutation from the planner (`gnnssd.sampler.node_order`).

    With `edge_split` (train, valid, test fractions), or a source that has a link split
    of its own (`load_link_split`), the valid and test edges are held out of the stored
    graph and stored with `eval_negatives` fixed negatives each (see link_split); on a
    heterogeneous graph the split is of the relation `edge_split_relation` (required
    when there are several).

    `out` must be new, an empty directory or an existing store (replaced atomically) and
    must not overlap the input; one preprocess at a time holds it (a lock file beside it).
    `memory_limit` (bytes; default half the available memory) bounds the topology build:
    an edge list that does not fit is sorted out of core (storage_format/csc_external.py).
    """
    out = Path(out)
    if dtype not in FEATURE_DTYPES:
        raise DatasetError(f"dtype {dtype!r}: expected one of {FEATURE_DTYPES}")
    if source.feat_dim < 1:
        raise DatasetError(f"{source.name}: feature dim {source.feat_dim}; every node needs at "
                           "least one feature")
    if edge_split is None and edge_split_relation is not None:
        raise DatasetError(f"--edge-split-relation {edge_split_relation!r} without --edge-split: "
                           "name the fractions too, e.g. --edge-split 0.85,0.05,0.10")
    # refuses what the kind cannot have, a missing or unknown relation name, before anything is written
    parts = schema_parts(source, edge_split=edge_split is not None, edge_split_relation=edge_split_relation)
    inputs = [Path(p).resolve() for p in getattr(source, "input_paths", list)()]
    _check_no_overlap(out, inputs)
    with output_lock(out):
        _restore_interrupted_swap(out)
        _check_destination(out)
        params: dict[str, Any] = {"source": source.describe(), "order": order_name(order),
                                  "dtype": dtype}
        if edge_split is not None:
            params["edge_split"] = {"fractions": list(edge_split), "seed": split_seed,
                                    "eval_negatives": eval_negatives, **parts.split}
        topology: dict[str, int] = {}
        limit = memory_limit or default_memory_limit()
        _check_free_space(out, _partial_dir(out), _space_needed(source, dtype, order_name(order), None, limit))
        try:
            partial = _open_partial_dir(out, {**params, "inputs": _input_identity(inputs)})
            _write_partial(partial, source, order, dtype, params, progress, topology,
                           limit, edge_split, parts)
        except DiskFullError as exc:
            partial = _partial_dir(out)
            shutil.rmtree(partial, ignore_errors=True)
            needed = _space_needed(source, dtype, order_name(order), topology.get("num_edges"), limit)
            free = shutil.disk_usage(out.parent).free
            raise DiskFullError(f"{exc}; removed the unfinished store {partial}; preprocess "
                                f"needs about {_mib(needed)} free there ({_mib(free)} free "
                                "now)") from None
        _swap_into_place(partial, out)
    return out


@dataclass(frozen=True)
class SchemaParts:
    """What a typed graph's store holds beside a homogeneous one's, and how its topology is
    built; empty for a homogeneous graph, whose store the format keeps without them (no
    schema, no etypes file, a link split with no relation): preprocess asks the graph's kind
    once, in schema_parts."""
    #: the manifest's "schema" entry
    manifest: dict[str, Any]
    #: the arrays of the relations (the topology step staged them in the partial folder)
    arrays: tuple[str, ...]
    #: the edge split's relation, by name (the preprocess parameters)
    split: dict[str, str]
    #: the link section's relation (source type, name, destination type)
    link: dict[str, list[str]]
    #: how the topology steps build the CSC, the edge split and the relations
    topology: TopologyParts


def schema_parts(source: DatasetSource, *, flatten: bool = False, self_loops: bool = False,
                 edge_split: bool = False, edge_split_relation: str | None = None) -> SchemaParts:
    """The typed parts of `source`'s store, what its kind allows checked: `flatten`
    (--flatten) needs a heterogeneous graph; `self_loops` (--self-loops) and a dataset's own
    link split need one relation (a heterogeneous graph flattened first, which the CLI
    checks before flattening); `edge_split_relation` is refused on a homogeneous graph (one
    relation, no names) and, with `edge_split`, names the split's on a typed one (required
    where it has several)."""
    schema = schema_of(source)
    if schema.is_homogeneous:
        if flatten:
            raise DatasetError("--flatten: the dataset has one node type and one relation already")
        if edge_split_relation is not None:
            raise DatasetError(f"{source.name}: --edge-split-relation {edge_split_relation!r}: the graph has one "
                               "node type and one relation; drop --edge-split-relation")
        return SchemaParts({}, (), {}, {}, plain_topology())
    if self_loops and not flatten:
        raise DatasetError("--self-loops: a heterogeneous graph has no relation for them; "
                           "add a relation in the dataset, or --flatten it")
    if hasattr(source, "load_link_split") and not flatten:
        raise DatasetError(f"{source.name}: a heterogeneous dataset's own link split is not "
                           "supported yet; split one relation with --edge-split")
    relation = split_relation(schema, edge_split_relation, source.name) if edge_split else None
    split = {} if relation is None else {"relation": schema.relations[relation][1]}
    link = {} if relation is None else {"relation": list(schema.relations[relation])}
    return SchemaParts({"schema": schema.to_manifest()}, (ETYPES,), split, link, typed_topology(schema))


def _write_partial(partial: Path, source: DatasetSource, order: str | Permutation, dtype: str,
                   params: dict[str, Any], progress: Callable[[str, int, int], None] | None,
                   topology: dict[str, int], limit: int,
                   edge_split: tuple[float, float, float] | None, parts: SchemaParts) -> None:
    """Write (or finish writing) every file of the store into `partial`, manifest last;
    `topology` gets num_edges once known (for the disk-full estimate). Each step's wall
    and CPU time, peak RSS and bytes written are logged and recorded in the manifest's
    `preprocess_steps` (this run's steps: a resumed run lists only those it did)."""
    notify = progress or (lambda stage, done, total: None)
    steps: dict[str, dict[str, float]] = {}
    labels = _checked_labels(source)
    has_link = edge_split is not None or hasattr(source, "load_link_split")
    splits = _checked_splits(source, labels, needs_train=not has_link)
    schema = schema_of(source)
    _check_splits_in_target(source, schema, splits)
    num_classes = int(labels.max()) + 1 if (labels >= 0).any() else 0
    link = _link_split(source, edge_split, params.get("edge_split", {}), parts.topology)
    order, perm, inv, indptr, indices = _store_topology(partial, source, order, splits["train"],
                                                        link, limit, notify, steps, parts.topology)
    topology["num_edges"] = int(indices.shape[0])

    written = _written_dtype(dtype)
    files: dict[str, dict[str, int]] = {}
    with _step(steps, "features"):
        if order == "original":
            files[FEATURES] = _stream_features(partial, FEATURES, source, written, notify)
        else:
            row_bytes = source.feat_dim * np.dtype(written).itemsize
            # the featured types are the prefix of the IDs, which a typed order keeps
            files[FEATURES] = reordered_features(
                partial, FEATURES, _checked_feature_rows(source, written), inv[:schema.feature_rows], row_bytes,
                _window_rows(spare_memory(limit), row_bytes), notify)
    if dtype == "int8":
        with _step(steps, "quantize"):
            files.update(_quantize_features(partial, schema.feature_rows, source.feat_dim, notify))
    with _step(steps, "page checksums"):
        files[PAGE_CHECKSUMS] = _write_page_checksums(partial, notify)
    row_bytes = source.feat_dim * np.dtype(dtype).itemsize

    # labels, perm and inv are held narrow (int16 labels, index-dtype IDs: 0.5 + 1 + 1 GB at
    # MAG240M's 244M nodes instead of 2 GB each) and stored int64, as is every array but
    # the topology's indices and relations
    arrays = {"indptr": indptr, "indices": indices, "labels": labels[perm],
              "perm": perm, "inv": inv,
              **{f"{k}_idx": np.sort(inv[v]) for k, v in splits.items()}}
    assert set(arrays) == set(ARRAY_FILES)
    arrays.update({name: np.load(partial / f"{name}.npy", mmap_mode="r") for name in parts.arrays})
    if link is not None:
        arrays.update(link.renumbered(inv).arrays())
    with _step(steps, "arrays"):
        for name, array in arrays.items():
            stored = None if name in ("indices", ETYPES) else np.dtype(np.int64)
            files[f"{name}.npy"] = _save_array(partial / f"{name}.npy", array, stored)

    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "name": source.name,
        "num_nodes": source.num_nodes,
        "num_edges": int(indices.shape[0]),
        "num_classes": num_classes,
        "features": {"file": FEATURES, "dim": source.feat_dim, "dtype": dtype,
                     "row_bytes": row_bytes, "rows": schema.feature_rows, "offset": 0, "alignment": PAGE,
                     "page_checksums": PAGE_CHECKSUMS, **({"row_scales": ROW_SCALES} if dtype == "int8" else {})},
        "order": order,
        "files": files,
        "preprocess": params,
        "preprocess_steps": steps,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gnnssd_version": _version(),
    }
    manifest.update(parts.manifest)
    if link is not None:
        manifest["link"] = {"split": params.get("edge_split", "dataset"), **parts.link,
                            "edges": {k: len(v) for k, v in link.edges.items()},
                            "eval_negatives": int(link.negatives["test"].shape[1])}
    manifest["checksum"] = manifest_checksum(manifest)
    (partial / PROGRESS).unlink()
    with _writing(partial / MANIFEST, "the manifest"):
        atomic_write_json(partial / MANIFEST, manifest, into_store=True)
    for name in TOPOLOGY_STAGING:
        (partial / name).unlink(missing_ok=True)
    log.info("preprocess steps: %s", "; ".join(f"{k} {v['wall_s']:.1f} s wall, {v['cpu_s']:.1f} s "
                                              f"CPU, {v['peak_rss_bytes'] / 2**30:.2f} GiB peak RSS"
                                              for k, v in steps.items()))


def _space_needed(source: DatasetSource, dtype: str, order: str, num_edges: int | None,
                  memory_limit: int) -> int:
    """Bytes preprocess needs at its peak: the store (features, their page checksums, the
    int64 node arrays, indices of `num_edges` edges: the source's count, reverses included,
    when not yet known) plus the largest scratch of one step beside what exists by then:
    the edge spill (two IDs per edge), the renumbered topology's second copy, or the feature
    windows of a reorder (or the float32 rows an int8 store is quantized from)."""
    written = np.dtype(_written_dtype(dtype)).itemsize
    rows = schema_of(source).feature_rows  # a typed graph's featured types only
    features = -(-rows * source.feat_dim * np.dtype(dtype).itemsize // PAGE) * PAGE
    if num_edges is None:
        num_edges = (edge_count(source) or 0) * (2 if source.symmetric else 1)
    ids = index_dtype(source.num_nodes).itemsize
    indices = ids * num_edges
    row_bytes = source.feat_dim * written
    staged = 0
    if order != "original":
        staged = rows * row_bytes + _window_rows(memory_limit // 2, row_bytes) * row_bytes
    if dtype == "int8":
        staged = max(staged, rows * row_bytes)
    scratch = max(2 * ids * num_edges, indices, staged)
    return features + scratch + features // PAGE * 4 + 8 * 6 * source.num_nodes + indices


def _version() -> str:
    """The installed gnnssd's version (gnnssd.__version__), from its package metadata: the
    store layer does not import the gnnssd package above it."""
    try:
        return importlib.metadata.version("gnnssd")
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed
        return "unknown"
