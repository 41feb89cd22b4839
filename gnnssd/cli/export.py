"""`gnnssd export graphbolt STORE OUT`: a store back out as DGL GraphBolt's OnDiskDataset.

The way out (and a cross-check against another system): OUT/metadata.yaml with .npy files,
everything in the dataset's own IDs (a store in a locality or degree order is mapped back
through perm), which `dgl.graphbolt.OnDiskDataset(OUT).load()` opens:

    graph:        nodes [{num}] or [{type, num}], edges [{format: numpy, path}] of (2, E)
                  (source, destination) pairs: the store's in-edges, per relation
    feature_data: the node features `feat` (per featured type, its own width), float32 for an
                  int8 store (dequantized as the loaders give them), else the stored dtype;
                  and the labels as node feature `label` (-1: unlabelled)
    tasks:        node_classification: train/validation/test sets of (seed_nodes, labels)

Node tasks only: a link store's edge splits are not exported.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from gnnssd.storage_format import (GraphSchema, Store, StoreError, atomic_file, atomic_write_bytes, contained,
                                   new_output_folder)

CHUNK_ROWS = 1 << 16  # feature rows gathered per pass (bounded memory on a large store)
SETS = {"train": "train_set", "valid": "validation_set", "test": "test_set"}
#: Per node type or relation: (its `type` key in metadata.yaml, none or one; its files' stem).
GraphBoltNames = list[tuple[dict[str, str], str]]


def export_graphbolt(store: Store, out: Path) -> Path:
    """Write `store` as an OnDiskDataset under `out`, a new or empty folder outside any
    store (partial_dir.new_output_folder: locked, built in .NAME.partial and renamed, so a
    failed export leaves nothing); returns the metadata.yaml's path."""
    if store.has_link_split:
        raise ValueError(f"{store.path}: a link-prediction store; `export graphbolt` writes node tasks only")
    out = Path(out)
    with new_output_folder(out, "gnnssd export", "OUT", _refuse_earlier_export) as partial:
        _write_dataset(store, partial)
    return out / "metadata.yaml"


def _refuse_earlier_export(out: Path) -> None:
    if (out / "metadata.yaml").exists():
        raise FileExistsError(f"{out / 'metadata.yaml'}: already there; export into a new directory")


def _write_dataset(store: Store, out: Path) -> None:
    """The dataset's files and metadata.yaml in `out`; every file named after a node type
    or relation is checked to stay inside `out`."""
    schema = store.schema
    type_entries, relation_entries = _graphbolt_names(schema)
    nodes, edges, features = [], [], []
    for node_type, (key, stem) in zip(schema.node_types, type_entries):
        nodes.append({"num": int(node_type.count), **key})
        _save(_inside(out, f"{stem}-label.npy"), store.node_labels(np.arange(node_type.count), node_type.name))
        features.append(_feature("label", key, f"{stem}-label.npy"))
        if node_type.features:
            width = node_type.dim or store.feat_dim
            _write_features(store, node_type.name, node_type.count, width, _inside(out, f"{stem}-feat.npy"))
            features.append(_feature("feat", key, f"{stem}-feat.npy"))
    graph = store.graph()
    for relation, (key, stem) in zip(schema.relations, relation_entries):
        path = f"{stem}.npy"
        src, dst = graph.edges(etype=relation, order="eid")  # in the store's CSC order
        _save(_inside(out, path), np.stack([src.numpy(), dst.numpy()]))
        edges.append({"format": "numpy", "path": path, **key})
    task = {"name": "node_classification", "num_classes": int(store.num_classes)}
    for split, key in SETS.items():
        seeds = np.asarray(store.split(split), np.int64)
        _save(out / f"{split}-seed_nodes.npy", seeds)
        _save(out / f"{split}-labels.npy", store.node_labels(seeds))
        data = [{"name": "seed_nodes", "format": "numpy", "path": f"{split}-seed_nodes.npy"},
                {"name": "labels", "format": "numpy", "path": f"{split}-labels.npy"}]
        task[key] = [{"data": data, **type_entries[schema.type_id(schema.target)][0]}]
    meta = {"dataset_name": str(store.manifest.get("name", store.path.name)),
            "graph": {"nodes": nodes, "edges": edges}, "feature_data": features, "tasks": [task]}
    atomic_write_bytes(out / "metadata.yaml", yaml.safe_dump(meta, sort_keys=False).encode())


def _graphbolt_names(schema: GraphSchema) -> tuple[GraphBoltNames, GraphBoltNames]:
    """(the metadata's `type` key, the file stem) of each node type and of each relation:
    GraphBolt's homogeneous form names no type (the export's one question of the kind)."""
    if schema.is_homogeneous:
        return [({}, "node")], [({}, "edges")]
    return ([({"type": name}, name) for name in schema.type_names],
            [({"type": ":".join(r)}, f"edges-{r[1]}") for r in schema.relations])


def _inside(out: Path, name: str) -> Path:
    """`out / name` for a file named after a type or relation, refused unless it is a file
    directly in `out` (schema.py refuses such names already; this keeps export's own promise)."""
    path = contained(out, name, where="export file")
    if path.parent != out:
        raise StoreError(f"{path}: export file {name!r} is not a plain file name in {out}")
    return path


def _feature(name: str, type_key: dict[str, str], path: str) -> dict:
    return {"domain": "node", **type_key, "name": name,
            "format": "numpy", "path": path, "in_memory": False}


def _save(path: Path, array: np.ndarray) -> None:
    """A .npy written through the project's one safe writer (a fresh file, renamed into place)."""
    with atomic_file(path) as f:
        np.save(f, array)


def _write_features(store: Store, node_type: str, count: int, width: int, path: Path) -> None:
    """The type's features in its dataset ID order, CHUNK_ROWS at a time into a .npy."""
    dtype = np.dtype(np.float32 if store.feat_dtype == np.int8 else store.feat_dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (count, width)}
    with atomic_file(path) as f:
        np.lib.format.write_array_header_1_0(f, header)
        for lo in range(0, count, CHUNK_ROWS):
            ids = np.arange(lo, min(lo + CHUNK_ROWS, count))
            if dtype == np.float32:
                rows = store.node_features(ids, node_type)
            else:  # the stored values, unconverted
                rows = store.features_memmap()[store.store_ids(ids, node_type)][:, :width]
            f.write(np.ascontiguousarray(rows, dtype=dtype).tobytes())
