"""The checks on preprocess's input: labels, node splits and edge endpoints, feature rows,
(the graph's kind and the options: the writer's schema_parts). Each error names the
dataset, the value and what was expected."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DatasetError
from ..schema import GraphSchema
from .source import DatasetSource

#: Any store may have this many classes; more only with as many labelled nodes (a label of
#: 10**9 on a small graph is a data error, and would size the output layer at 10**9).
FEW_CLASSES = 1 << 16


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
    if labels.dtype.kind != "i":  # signed labels are checked as given (int16: no int64 copy)
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
    # held in the narrowest signed type of its values (int16 for papers' 172 classes: a
    # quarter of int64's 0.9 GB at 111M nodes); the store's labels.npy is written as int64
    return labels.astype(np.min_scalar_type(-max(classes, 1)))


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
