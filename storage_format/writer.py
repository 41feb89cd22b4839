"""Writing a store from a DatasetSource: streamed, validated, atomic and resumable.

The store is built in a hidden sibling directory `.NAME.partial`, which is swapped
into place only once complete (manifest last). A preprocess that dies leaves any
previous store untouched; rerun with the same inputs and it resumes the feature
copy from the last chunk that reached the disk. Only folders carrying preprocess's
marker file (OWNER_MARKER) are resumed, moved or deleted.
"""
from __future__ import annotations

import datetime
import errno
import fcntl
import importlib.metadata
import json
import logging
import os
import shutil
import time
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import psutil

from .atomic import ChecksummedWriter, atomic_write_json, crc32_of_file, fsync_dir
from .csc import csc_from_edges, index_dtype, renumber_csc_to_file
from .csc_external import BUCKET_IDS_PER_EDGE, external_csc
from .errors import DatasetError, StoreError
from .link_split import (LinkSplit, checked_link_split, held_out_mask, random_link_split,
                         relation_link_split, split_relation)
from .manifest import (ARRAY_FILES, ETYPES, FEATURE_DTYPES, FEATURES, FORMAT_NAME, FORMAT_VERSION,
                       MANIFEST, PAGE, PAGE_CHECKSUMS, ROW_SCALES, foreign_entries, is_store_manifest,
                       manifest_checksum)
from .order import Permutation, order_name, resolve_order
from .page_crc import page_crc32c
from .progress import PROGRESS, record, state_of
from .quantize import quantize_rows
from .reorder import reordered_features
from .schema import GraphSchema
from .small_files import read_small_json
from .source import DatasetSource, edge_chunks, edge_count, schema_of
from .typed_csc import checked_relation_edges, typed_csc

log = logging.getLogger(__name__)

QUANTIZED_FEATURES = "features.int8.bin"  # int8 rows until they replace the float32 features.bin
CHUNK_BYTES = 16 << 20
#: Any store may have this many classes; more only with as many labelled nodes (a label of
#: 10**9 on a small graph is a data error, and would size the output layer at 10**9).
FEW_CLASSES = 1 << 16
HEAD_BYTES = 1 << 20  # of each input file, checksummed for the resume key
#: Edges per chunk streamed into the out-of-core topology build.
CHUNK_EDGES = 1 << 20
#: The smallest bucket of the out-of-core topology build, whatever the memory limit.
MIN_BUCKET_EDGES = 1 << 16
#: Memory preprocess needs besides its arrays (interpreter, libraries, edge chunks in flight).
RUNTIME_BYTES = 512 << 20
#: The marker file of the folders preprocess makes beside --out (.NAME.partial, .NAME.old),
#: naming gnnssd and --out: a folder of those names without it is the user's, never touched.
OWNER_MARKER = ".gnnssd-preprocess.json"
MADE_BY = "gnnssd preprocess"
#: The default --memory-limit: this fraction of the memory available when preprocess starts.
DEFAULT_MEMORY_FRACTION = 0.5


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
    _check_typed_options(source)
    if edge_split is None and edge_split_relation is not None:
        raise DatasetError(f"--edge-split-relation {edge_split_relation!r} without --edge-split: "
                           "name the fractions too, e.g. --edge-split 0.85,0.05,0.10")
    schema = schema_of(source)
    # refuses a missing or unknown relation name before anything is written
    relation = None if edge_split is None else split_relation(schema, edge_split_relation, source.name)
    inputs = [Path(p).resolve() for p in getattr(source, "input_paths", list)()]
    _check_no_overlap(out, inputs)
    with _destination_lock(out):
        _restore_interrupted_swap(out)
        _check_destination(out)
        params: dict[str, Any] = {"source": source.describe(), "order": order_name(order),
                                  "dtype": dtype}
        if edge_split is not None:
            params["edge_split"] = {"fractions": list(edge_split), "seed": split_seed,
                                    "eval_negatives": eval_negatives}
            if not schema.is_homogeneous:
                params["edge_split"]["relation"] = schema.relations[relation][1]
        topology: dict[str, int] = {}
        limit = memory_limit or default_memory_limit()
        _check_free_space(out, _partial_dir(out), _space_needed(source, dtype, order_name(order), None, limit))
        try:
            partial = _open_partial_dir(out, {**params, "inputs": _input_identity(inputs)})
            _write_partial(partial, source, order, dtype, params, progress, topology,
                           limit, edge_split)
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


def _check_typed_options(source: DatasetSource) -> None:
    """What a heterogeneous store cannot have yet: a dataset's own link split."""
    if schema_of(source).is_homogeneous:
        return
    if hasattr(source, "load_link_split"):
        raise DatasetError(f"{source.name}: a heterogeneous dataset's own link split is not "
                           "supported yet; split one relation with --edge-split")


def _write_partial(partial: Path, source: DatasetSource, order: str | Permutation, dtype: str,
                   params: dict[str, Any], progress: Callable[[str, int, int], None] | None,
                   topology: dict[str, int], limit: int,
                   edge_split: tuple[float, float, float] | None) -> None:
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
    link = _link_split(source, edge_split, params.get("edge_split", {}))
    order, perm, inv, indptr, indices = _store_topology(partial, source, order, splits["train"],
                                                        link, limit, notify, steps)
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

    arrays = {"indptr": indptr, "indices": indices, "labels": labels[perm],
              "perm": perm, "inv": inv,
              **{f"{k}_idx": np.sort(inv[v]) for k, v in splits.items()}}
    assert set(arrays) == set(ARRAY_FILES)
    if not schema.is_homogeneous:
        arrays[ETYPES] = np.load(partial / f"{ETYPES}.npy", mmap_mode="r")
    if link is not None:
        arrays.update(link.renumbered(inv).arrays())
    with _step(steps, "arrays"):
        for name, array in arrays.items():
            files[f"{name}.npy"] = _save_array(partial / f"{name}.npy", array)

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
    if not schema.is_homogeneous:
        manifest["schema"] = schema.to_manifest()
    if link is not None:
        manifest["link"] = {"split": params.get("edge_split", "dataset"),
                            **({} if schema.is_homogeneous else
                               {"relation": list(schema.relations[split_relation(schema, params["edge_split"]["relation"],
                                                                                  source.name)])}),
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


# --- steps: timed, resumable -----------------------------------------------------------

@contextmanager
def _step(steps: dict[str, dict[str, float]], name: str) -> Iterator[None]:
    """Time one step of preprocess: wall and CPU seconds, peak RSS (the kernel's high-water
    mark, reset at the step's start where /proc allows), bytes written to storage."""
    _reset_peak_rss()
    wall, cpu, written = time.perf_counter(), time.process_time(), _bytes_written()
    yield
    steps[name] = {"wall_s": round(time.perf_counter() - wall, 2),
                   "cpu_s": round(time.process_time() - cpu, 2),
                   "peak_rss_bytes": _peak_rss(), "written_bytes": _bytes_written() - written}
    log.info("step %s: %.1f s wall, %.1f s CPU, %.2f GiB peak RSS", name, steps[name]["wall_s"],
             steps[name]["cpu_s"], steps[name]["peak_rss_bytes"] / 2**30)


def _reset_peak_rss() -> None:
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int:
    with suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _bytes_written() -> int:
    with suppress(OSError):
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


#: Topology files of unfinished steps, in the partial folder (gone from a finished store).
CSC_INDPTR, CSC_INDICES = "csc.indptr.npy", "csc.indices.npy"
ORDER_PERM, STORE_INDPTR = "order.perm.npy", "topology.indptr.npy"
TOPOLOGY_STAGING = (CSC_INDPTR, CSC_INDICES, ORDER_PERM, STORE_INDPTR)
#: Edges renumbered per chunk when the topology is laid out in the store's order.
RENUMBER_CHUNK_EDGES = 1 << 26


def _store_topology(partial: Path, source: DatasetSource, order: str | Permutation,
                    train_idx: np.ndarray, link: LinkSplit | None, limit: int,
                    notify: Callable[[str, int, int], None],
                    steps: dict[str, dict[str, float]]) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(order name, perm, inv, indptr, indices) of the store: the CSC in the source's
    order, the node order over it, and the CSC renumbered into that order (out of core,
    as indices.npy of the partial folder). Each step is recorded once durable, so a
    resumed run skips the finished ones."""
    name = order_name(order)
    if not state_of(partial, "renumber")["done"]:
        schema = schema_of(source)
        with _step(steps, "topology"):
            indptr, indices = _resumable_csc(partial, source, link, limit, notify)
        with _step(steps, "order"):
            perm = _resumable_order(partial, order, indptr, indices, train_idx,
                                    None if schema.is_homogeneous else schema.offsets)
        if schema.is_homogeneous or name == "original":
            with _step(steps, "renumber"):
                _renumber(partial, name, indptr, indices, perm, _inverse(perm), limit, notify)
            del indptr, indices
        else:
            del indptr, indices, perm  # the typed topology is rebuilt from the edges, in memory
            with _step(steps, "renumber"):
                _renumber_typed(partial, source, link, limit, notify)
    perm = np.arange(source.num_nodes, dtype=np.int64) if name == "original" else np.load(partial / ORDER_PERM)
    return (name, perm, _inverse(perm), np.load(partial / STORE_INDPTR),
            np.load(partial / "indices.npy", mmap_mode="r"))


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty(perm.shape[0], dtype=np.int64)
    inv[perm] = np.arange(perm.shape[0], dtype=np.int64)
    return inv


def _resumable_csc(partial: Path, source: DatasetSource, link: LinkSplit | None, limit: int,
                   notify: Callable[[str, int, int], None]) -> tuple[np.ndarray, np.ndarray]:
    """The CSC in the source's node order (indices mapped from the partial folder)."""
    if not state_of(partial, "csc")["done"]:
        if not schema_of(source).is_homogeneous:
            indptr, indices, etypes = typed_csc(source, notify, limit, link=link)
            _save_array(partial / f"{ETYPES}.npy", etypes)
            del etypes
        elif link is None:
            indptr, indices = _checked_csc(source, limit, partial, notify)
        else:
            indptr, indices = _csc_without_held_out(source, link)
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


def _renumber(partial: Path, order: str, indptr: np.ndarray, indices: np.ndarray,
              perm: np.ndarray, inv: np.ndarray, limit: int,
              notify: Callable[[str, int, int], None]) -> None:
    """Write the topology in store order: indices.npy in the partial folder (renumbered
    out of core, or the source-order file linked when the order is the original)."""
    final = partial / "indices.npy"
    final.unlink(missing_ok=True)  # from an earlier attempt at this step
    if order == "original":
        new_indptr = indptr
        os.link(partial / CSC_INDICES, final)
    else:
        # pass 1 holds a chunk and the old indices' pages it mapped; pass 2 a window and its file
        chunk = min(RENUMBER_CHUNK_EDGES, max(1 << 16, spare_memory(limit) // (4 * indices.dtype.itemsize)))
        new_indptr, _ = renumber_csc_to_file(indptr, indices, perm, inv, final, chunk,
                                             lambda done, total: notify("renumber", done, total))
    _save_array(partial / STORE_INDPTR, new_indptr)
    record(partial, "renumber", {"done": 1})
    (partial / CSC_INDICES).unlink()


def _renumber_typed(partial: Path, source: DatasetSource, link: LinkSplit | None, limit: int,
                    notify: Callable[[str, int, int], None]) -> None:
    """The typed topology in store order: built again from the source's edges with each
    end relabelled (its relation runs and their source order hold in the new IDs; the link
    split's held-out pairs left out as in the source-order build), as
    indices.npy and etypes.npy (the source-order ones replaced) of the partial folder.
    Peak memory: the source-order build's, the relabelling being dropped before the
    interleave (typed_csc)."""
    dtype = index_dtype(schema_of(source).num_nodes)
    # no name here holds the relabelling: typed_csc takes it out of the list and drops it
    indptr, indices, etypes = typed_csc(source, notify, limit,
                                        relabel=[_inverse(np.load(partial / ORDER_PERM)).astype(dtype)], link=link)
    for path, array in ((partial / "indices.npy", indices), (partial / f"{ETYPES}.npy", etypes),
                        (partial / STORE_INDPTR, indptr)):
        _save_array(path, array)
    record(partial, "renumber", {"done": 1})
    (partial / CSC_INDICES).unlink()


def _window_rows(spare: int, row_bytes: int) -> int:
    """Rows of one window of the out-of-core feature reorder: half the memory to spare
    (the window, and the rows read into it), at most 4 GiB."""
    return max(_chunk_rows(row_bytes), min(spare // 2, 4 << 30) // max(row_bytes, 1))


def spare_memory(limit: int) -> int:
    """What `limit` leaves beside this process's resident memory now (its arrays, the
    source's tables, the interpreter): what a step may still take."""
    return max(limit - psutil.Process().memory_info().rss, 0)


def _version() -> str:
    """The installed gnnssd's version (gnnssd.__version__), from its package metadata: the
    store layer does not import the gnnssd package above it."""
    try:
        return importlib.metadata.version("gnnssd")
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed
        return "unknown"


# --- the destination: its checks, its lock, running out of space -----------------------

class DiskFullError(StoreError):
    """The filesystem filled up while preprocess wrote the store."""


@contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """Name the file and its content when writing it runs out of space."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise DiskFullError(f"no space left on the device while writing {what} to {path}") from None


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


def _check_free_space(out: Path, partial: Path, needed: int) -> None:
    """Refuse before writing anything when the filesystem of `out` cannot hold what
    preprocess will write (what an interrupted run left in `partial` counts as written)."""
    have = sum(p.stat().st_size for p in partial.iterdir() if p.is_file()) if partial.is_dir() else 0
    free = shutil.disk_usage(out.parent).free
    if needed - have > free:
        raise DiskFullError(f"--out {out}: not enough free disk; preprocess needs about "
                            f"{_mib(needed - have)} free there ({_mib(free)} free now) on the "
                            f"filesystem of {out.parent}; free some space or choose another --out")


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def _check_no_overlap(out: Path, inputs: list[Path]) -> None:
    target = out.resolve()
    for path in inputs:
        if target == path or path in target.parents or target in path.parents:
            raise StoreError(f"--out {out}: overlaps the input {path}; write the store to a "
                             "folder outside the input files")


def _check_destination(out: Path) -> None:
    """Replace only what preprocess made: a store, or an empty folder; reuse or delete
    only a .NAME.partial beside it that preprocess made."""
    if os.path.lexists(_partial_dir(out)):
        _check_ours(_partial_dir(out), out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise StoreError(f"--out {out}: exists and is not a directory; refusing to replace "
                         "it (choose another --out)")
    if out.is_dir() and any(out.iterdir()) and not is_store_manifest(out / MANIFEST):
        raise StoreError(f"--out {out}: an existing folder that is not a gnnssd store (no "
                         f"gnnssd {MANIFEST}); refusing to replace its contents (choose a new "
                         "or empty folder)")
    foreign = foreign_entries(out) if out.is_dir() else []
    if foreign:
        raise StoreError(f"--out {out}: the store holds {len(foreign)} entries that are not its own "
                         f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); replacing the "
                         "store would delete them: move them out first")


@contextmanager
def _destination_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on `out`: the file .NAME.lock beside it, holding our pid,
    removed when done. A lock taken on a file another holder removed meanwhile is
    retaken on the new file, so two processes never both hold it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f".{out.name}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(f"--out {out}: another gnnssd preprocess (pid {holder}) is writing "
                             f"this store (lock {path}); wait for it to finish") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _input_identity(inputs: list[Path]) -> list[dict[str, Any]]:
    """Path, size, mtime and the CRC-32 of the first MiB of every input file (all files
    under an input folder): what an interrupted preprocess must match to be resumed."""
    identity = []
    for root in inputs:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            stat = path.stat()
            with open(path, "rb") as f:
                head = zlib.crc32(f.read(HEAD_BYTES))
            identity.append({"path": str(path), "size": stat.st_size,
                             "mtime_ns": stat.st_mtime_ns, "head_crc32": head})
    return identity


# --- the partial directory, resume and the final swap -------------------------------

def _partial_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def _old_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.old"


def _mark(folder: Path, out: Path) -> None:
    """Sign `folder` (.NAME.partial, or the store about to become .NAME.old) as preprocess's."""
    with _writing(folder / OWNER_MARKER, "the preprocess marker"):
        atomic_write_json(folder / OWNER_MARKER, {"made_by": MADE_BY, "target": out.name}, into_store=True)


def _check_ours(folder: Path, out: Path) -> None:
    """Refuse `folder` (.NAME.partial or .NAME.old beside `out`) unless preprocess made it
    (or it is an empty folder: a kill between its mkdir and its marker leaves one): only
    then may it be deleted, resumed or moved into place."""
    if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        return
    marker = None
    if folder.is_dir() and not folder.is_symlink():
        with suppress(OSError, ValueError):
            marker = read_small_json(folder / OWNER_MARKER)
    if not (isinstance(marker, dict) and marker.get("made_by") == MADE_BY
            and marker.get("target") == out.name):
        raise StoreError(f"{folder}: not made by gnnssd preprocess (no {OWNER_MARKER} naming "
                         f"--out {out.name}); refusing to delete or reuse it (move it away or "
                         "choose another --out)")


def _open_partial_dir(out: Path, params: dict[str, Any]) -> Path:
    """Reuse a partial directory left by an identical interrupted run, else start afresh
    (the folder is preprocess's: _check_destination checked its marker)."""
    partial = _partial_dir(out)
    progress_file = partial / PROGRESS
    if partial.exists():
        try:
            same = read_small_json(progress_file).get("params") == params
        except (OSError, ValueError):
            same = False
        if same:
            log.info("resuming the interrupted preprocess in %s", partial)
            return partial
        shutil.rmtree(partial)
    partial.mkdir()
    _mark(partial, out)
    with _writing(progress_file, "the preprocess progress record"):
        atomic_write_json(progress_file, {"params": params, "files": {}}, into_store=True)
    return partial


def _restore_interrupted_swap(out: Path) -> None:
    """A crash between the two renames of the swap leaves the old store at .NAME.old."""
    old = _old_dir(out)
    if os.path.lexists(old):
        _check_ours(old, out)
        if out.exists():
            shutil.rmtree(old)
        else:
            os.rename(old, out)
            (out / OWNER_MARKER).unlink(missing_ok=True)


def _swap_into_place(partial: Path, out: Path) -> None:
    old = _old_dir(out)
    if out.exists():
        _mark(out, out)  # a store or an empty folder (_check_destination), soon .NAME.old
        os.rename(out, old)
    os.rename(partial, out)
    fsync_dir(out.parent)
    (out / OWNER_MARKER).unlink(missing_ok=True)
    if old.exists():
        shutil.rmtree(old)


# --- validation ------------------------------------------------------------------------

def _checked_labels(source: DatasetSource) -> np.ndarray:
    labels = np.asarray(source.load_labels())
    n = source.num_nodes
    if labels.shape != (n,):
        raise DatasetError(f"{source.name}: labels have shape {labels.shape}, expected ({n},)")
    if labels.dtype.kind == "f":
        if not np.all(np.isnan(labels) | (labels == np.round(labels))):
            raise DatasetError(f"{source.name}: labels must be integers, got fractional values")
        labels = np.where(np.isnan(labels), -1, labels)
    elif labels.dtype.kind not in "iub":
        raise DatasetError(f"{source.name}: labels have dtype {labels.dtype}, expected integers")
    labels = labels.astype(np.int64)
    bad = np.flatnonzero(labels < -1)
    if bad.size:
        raise DatasetError(f"{source.name}: label {labels[bad[0]]} of node {bad[0]} is out of "
                           "range (classes are 0..C-1, -1 marks unlabelled)")
    labelled = int((labels >= 0).sum())
    classes = int(labels.max()) + 1 if labelled else 0
    if classes > max(labelled, FEW_CLASSES):
        top = int(np.argmax(labels))
        raise DatasetError(f"{source.name}: label {labels[top]} of node {top} makes "
                           f"{classes:,} classes, more than the {labelled:,} labelled nodes "
                           f"(and more than {FEW_CLASSES:,}); labels must be class indices 0..C-1 "
                           f"with C at most max(labelled nodes, {FEW_CLASSES:,})")
    return labels


def _checked_splits(source: DatasetSource, labels: np.ndarray,
                    needs_train: bool = True) -> dict[str, np.ndarray]:
    """Node splits; a link-prediction store may have none (`needs_train` False)."""
    n = source.num_nodes
    raw = source.load_splits()
    unknown = set(raw) - {"train", "valid", "test"}
    if unknown or ("train" not in raw and needs_train):
        raise DatasetError(f"{source.name}: splits {sorted(raw)}; expected 'train' and "
                           "optionally 'valid', 'test'")
    splits = {}
    owner = np.full(n, -1, dtype=np.int8)
    for k, name in enumerate(("train", "valid", "test")):
        ids = np.asarray(raw.get(name, np.empty(0, np.int64)))
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise DatasetError(f"{source.name}: split {name!r} must be a 1-D integer array of "
                               f"node IDs, got shape {ids.shape} dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        out_of_range = ids[(ids < 0) | (ids >= n)]
        if out_of_range.size:
            raise DatasetError(f"{source.name}: split {name!r} holds node {out_of_range[0]}, "
                               f"outside 0..{n - 1}")
        if np.unique(ids).size != ids.size:
            raise DatasetError(f"{source.name}: split {name!r} lists a node twice")
        clash = ids[owner[ids] >= 0]
        if clash.size:
            other = ("train", "valid", "test")[owner[clash[0]]]
            raise DatasetError(f"{source.name}: node {clash[0]} is in both split {other!r} and "
                               f"split {name!r}; splits must not overlap")
        owner[ids] = k
        unlabelled = ids[labels[ids] < 0]
        if unlabelled.size:
            raise DatasetError(f"{source.name}: node {unlabelled[0]} of split {name!r} has no "
                               "label (-1)")
        splits[name] = ids
    if splits["train"].size == 0 and needs_train:
        raise DatasetError(f"{source.name}: split 'train' is empty")
    return splits


def _check_splits_in_target(source: DatasetSource, schema: GraphSchema,
                            splits: dict[str, np.ndarray]) -> None:
    """Splits of a heterogeneous graph name nodes of its target type."""
    t = schema.type_id(schema.target)
    lo, hi = schema.offsets[t], schema.offsets[t + 1]
    for name, ids in splits.items():
        outside = ids[(ids < lo) | (ids >= hi)]
        if outside.size:
            raise DatasetError(f"{source.name}: split {name!r} holds node {outside[0]}, not a "
                               f"node of the target type {schema.target!r} ({lo}..{hi - 1})")


def _link_split(source: DatasetSource, edge_split: tuple[float, float, float] | None,
                request: dict[str, Any]) -> LinkSplit | None:
    """The edge split: the source's own, drawn from the edges (`request`: the seed and
    negatives per evaluation edge), or none."""
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
    schema = schema_of(source)
    if not schema.is_homogeneous:
        r = split_relation(schema, request["relation"], source.name)
        t = schema.type_id(schema.relations[r][2])
        dst_nodes = (int(schema.offsets[t]), schema.node_types[t].count)
        return relation_link_split(*checked_relation_edges(source, schema, r), source.num_nodes, dst_nodes,
                                   edge_split, request["seed"], request["eval_negatives"], schema.relations[r][1])
    src, dst = _checked_edges(source, *source.load_edges(), first=0)
    return random_link_split(src, dst, source.num_nodes, edge_split, request["seed"],
                             request["eval_negatives"])


def _csc_without_held_out(source: DatasetSource, link: LinkSplit) -> tuple[np.ndarray, np.ndarray]:
    """The CSC of the edges minus the link split's held-out ones (in memory: the split
    masks the whole edge list)."""
    src, dst = _checked_edges(source, *source.load_edges(), first=0)
    kept = ~held_out_mask(src, dst, source.num_nodes, link)
    return csc_from_edges(src[kept], dst[kept], source.num_nodes, symmetric=source.symmetric)


def default_memory_limit() -> int:
    return int(psutil.virtual_memory().available * DEFAULT_MEMORY_FRACTION)


def _checked_csc(source: DatasetSource, memory_limit: int, partial: Path,
                 notify: Callable[[str, int, int], None]) -> tuple[np.ndarray, np.ndarray]:
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


def _checked_edges(source: DatasetSource, src: Any, dst: Any,
                   first: int) -> tuple[np.ndarray, np.ndarray]:
    """Endpoint arrays checked for shape, type and node range (`first`: the index of the
    first edge, for the message), as int32 when both are int32 and int64 otherwise."""
    n = source.num_nodes
    src, dst = np.asarray(src), np.asarray(dst)
    if src.shape != dst.shape or src.ndim != 1:
        raise DatasetError(f"{source.name}: edge endpoint arrays have shapes {src.shape} and "
                           f"{dst.shape}, expected two equal 1-D arrays")
    for side, ends in (("source", src), ("destination", dst)):
        if ends.size and ends.dtype.kind not in "iu":
            raise DatasetError(f"{source.name}: edge {side}s have dtype {ends.dtype}, "
                               "expected integers")
        bad = np.flatnonzero((ends < 0) | (ends >= n))
        if bad.size:
            raise DatasetError(f"{source.name}: edge {first + bad[0]} has {side} {ends[bad[0]]}, "
                               f"outside the node range 0..{n - 1}")
    # int32 endpoints stay int32: the topology is the one thing preprocess holds in memory.
    dtype = np.int32 if src.dtype == dst.dtype == np.int32 else np.int64
    return src.astype(dtype, copy=False), dst.astype(dtype, copy=False)


def _checked_chunk(source: DatasetSource, chunk: np.ndarray, start: int,
                   dtype: str) -> np.ndarray:
    if chunk.ndim != 2 or chunk.shape[1] != source.feat_dim:
        raise DatasetError(f"{source.name}: feature rows from {start} have shape {chunk.shape}, "
                           f"expected (rows, {source.feat_dim})")
    if chunk.dtype.kind not in "fiub":
        raise DatasetError(f"{source.name}: features have dtype {chunk.dtype}, expected numbers")
    with np.errstate(over="ignore"):  # values too large for float16 become inf: reported below
        converted = np.ascontiguousarray(chunk, dtype=dtype)
    finite = np.isfinite(converted)
    if not finite.all():
        row, col = np.argwhere(~finite)[0]
        value = chunk[row, col]
        why = "does not fit float16" if np.isfinite(value) else "is not finite"
        raise DatasetError(f"{source.name}: feature value {value} at node {start + row}, "
                           f"column {col} {why}")
    return converted


# --- features --------------------------------------------------------------------------

def _chunk_rows(row_bytes: int) -> int:
    return max(1, CHUNK_BYTES // max(row_bytes, 1))


def _open_resumable(partial: Path, name: str) -> tuple[ChecksummedWriter, int]:
    """Open `name` for appending at the last durable chunk recorded for it."""
    state = state_of(partial, name)
    path = partial / name
    f = open(path, "r+b" if path.exists() else "w+b")
    f.truncate(state["size"])
    f.seek(state["size"])
    return ChecksummedWriter(f, state["crc32"], state["size"]), state["rows"]


def _finish_features(partial: Path, name: str, writer: ChecksummedWriter, rows: int) -> dict[str, int]:
    pad = -writer.size % PAGE
    writer.write(bytes(pad))
    writer.sync()
    writer.file.close()
    meta = {"size": writer.size, "crc32": writer.crc}
    record(partial, name, {"rows": rows, **meta, "done": 1})
    return meta


def _write_rows_resumably(partial: Path, name: str, blocks_from: Callable[[int], Iterator[np.ndarray]],
                          n: int, stage: str, notify: Callable[[str, int, int], None]) -> dict[str, int]:
    """Append the row blocks `blocks_from(first_row)` yields to `name`, recording each
    block once it is on disk, so an interrupted run resumes after the last one."""
    state = state_of(partial, name)
    if state["done"]:
        return {"size": state["size"], "crc32": state["crc32"]}
    with _writing(partial / name, "feature rows"):
        writer, row = _open_resumable(partial, name)
        try:
            for block in blocks_from(row):
                writer.write(block.data)
                row += len(block)
                writer.sync()
                record(partial, name, {"rows": row, "size": writer.size,
                                                 "crc32": writer.crc, "done": 0})
                notify(stage, row, n)
        except BaseException:
            # close now, not in a finalizer that would print a flush error on a full disk;
            # what did not reach the disk is not in the progress record either
            with suppress(OSError):
                writer.file.close()
            raise
        return _finish_features(partial, name, writer, row)


def _checked_feature_rows(source: DatasetSource, dtype: str) -> Callable[[int], Iterator[np.ndarray]]:
    """rows_from(first_row): the source's feature rows from `first_row` on, checked and
    converted to `dtype`, CHUNK_BYTES at a time."""
    n = schema_of(source).feature_rows
    chunk_rows = _chunk_rows(source.feat_dim * np.dtype(dtype).itemsize)

    def rows_from(row: int) -> Iterator[np.ndarray]:
        for chunk in source.feature_chunks(row, chunk_rows):
            if row + len(chunk) > n:
                raise DatasetError(f"{source.name}: more feature rows than the {n} nodes with features")
            yield _checked_chunk(source, np.asarray(chunk), row, dtype)
            row += len(chunk)
        if row != n:
            raise DatasetError(f"{source.name}: {row} feature rows for {n} nodes with features")

    return rows_from


def _stream_features(partial: Path, name: str, source: DatasetSource, dtype: str,
                     notify: Callable[[str, int, int], None]) -> dict[str, int]:
    return _write_rows_resumably(partial, name, _checked_feature_rows(source, dtype),
                                 schema_of(source).feature_rows, "features", notify)


def _maps(array: np.ndarray, path: Path) -> bool:
    """Whether `array` is a memory map of the file `path`."""
    return isinstance(array, np.memmap) and Path(array.filename or "").resolve() == path.resolve()


def _save_array(path: Path, array: np.ndarray) -> dict[str, int]:
    if _maps(array, path):
        with open(path, "rb") as f:  # written out of core by an earlier step: already a .npy
            os.fsync(f.fileno())
        return {"size": path.stat().st_size, "crc32": crc32_of_file(path)}
    with _writing(path, f"the array {path.stem}"), open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array))
        f.flush()
        os.fsync(f.fileno())
    return {"size": path.stat().st_size, "crc32": crc32_of_file(path)}


def _written_dtype(dtype: str) -> str:
    """The dtype features.bin is first written in: int8 rows are quantized from float32."""
    return "float32" if dtype == "int8" else dtype


def _quantize_features(partial: Path, n: int, dim: int,
                       notify: Callable[[str, int, int], None]) -> dict[str, dict[str, int]]:
    """Quantize the float32 features.bin (store order) into int8 rows and features.scale
    (`quantize_rows`) in one sequential pass, then replace features.bin with the int8 rows.
    A resumed run redoes the pass until it is recorded done; the replacement is a rename,
    repeated if the run stopped between the record and the rename."""
    state = {name: state_of(partial, name) for name in (QUANTIZED_FEATURES, ROW_SCALES)}
    if not state[ROW_SCALES]["done"]:
        chunk_rows = _chunk_rows(dim * 4)
        with (_writing(partial / QUANTIZED_FEATURES, "int8 feature rows"),
              open(partial / FEATURES, "rb") as src, open(partial / QUANTIZED_FEATURES, "wb") as codes_file,
              open(partial / ROW_SCALES, "wb") as scales_file):
            codes_out, scales_out = ChecksummedWriter(codes_file), ChecksummedWriter(scales_file)
            for lo in range(0, n, chunk_rows):
                rows = min(chunk_rows, n - lo)
                codes, params = quantize_rows(np.frombuffer(src.read(rows * dim * 4), "<f4").reshape(rows, dim))
                codes_out.write(codes.data)
                scales_out.write(params.astype("<f4").data)
                notify("quantize", lo + rows, n)
            codes_out.write(bytes(-codes_out.size % PAGE))
            codes_out.sync()
            scales_out.sync()
        for name, out in ((QUANTIZED_FEATURES, codes_out), (ROW_SCALES, scales_out)):
            state[name] = {"rows": n, "size": out.size, "crc32": out.crc, "done": 1}
            record(partial, name, state[name])
    if (partial / QUANTIZED_FEATURES).exists():
        os.replace(partial / QUANTIZED_FEATURES, partial / FEATURES)
    return {FEATURES: {"size": state[QUANTIZED_FEATURES]["size"], "crc32": state[QUANTIZED_FEATURES]["crc32"]},
            ROW_SCALES: {"size": state[ROW_SCALES]["size"], "crc32": state[ROW_SCALES]["crc32"]}}


def _write_page_checksums(partial: Path, notify: Callable[[str, int, int], None]) -> dict[str, int]:
    """features.crc32c: the CRC32C of every page of the finished features.bin (one
    sequential pass; rewritten whole by a resumed run)."""
    path = partial / PAGE_CHECKSUMS
    with (_writing(path, "the page checksums of features.bin"),
          open(partial / FEATURES, "rb") as src, open(path, "wb") as dst):
        total = os.fstat(src.fileno()).st_size
        while block := src.read(CHUNK_BYTES):
            dst.write(page_crc32c(block, PAGE).astype("<u4").tobytes())
            notify("page checksums", src.tell(), total)
        dst.flush()
        os.fsync(dst.fileno())
    return {"size": path.stat().st_size, "crc32": crc32_of_file(path)}
