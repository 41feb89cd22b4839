"""DGL GraphBolt's OnDiskDataset, as its users have it on disk (homogeneous graphs):

    ROOT/metadata.yaml
      graph:        nodes: [{num: N}]
                    edges: [{format: numpy, path: edges.npy}]    # (2, E); or format: csv
      feature_data: [{domain: node, name: feat, format: numpy|torch, path: ...}]
      tasks:        [{name: ..., num_classes: C,
                      train_set / validation_set / test_set:
                        [{data: [{name: seeds (or seed_nodes), format, path},
                                 {name: labels, format, path}]}]}]

Labels come with the seed nodes of each set (or from a node feature named `label`);
other nodes are unlabelled. Edges and features in numpy format are memory-mapped and
streamed chunk by chunk; torch-format files are mapped by `torch_file` (nothing they name can run).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError, SmallFileError, contained, read_small_yaml, shown

from .base import load_npy, mapped_edge_chunks, require_file, slice_chunks
from .ogb import csv_edges
from .torch_file import load_torch_file

SETS = {"train": "train_set", "valid": "validation_set", "test": "test_set"}
SEED_NAMES = ("seeds", "seed_nodes")


class GraphBoltMetadata:
    """metadata.yaml of a GraphBolt dataset and the files it names: what the homogeneous
    and the heterogeneous readers share."""

    def __init__(self, root: str | Path):
        root = Path(root)
        self.yaml_path = require_file(root / "metadata.yaml" if root.is_dir() else root)
        self.root = self.yaml_path.parent
        try:
            meta = read_small_yaml(self.yaml_path, what="GraphBolt metadata.yaml") or {}
        except SmallFileError as exc:
            raise DatasetError(str(exc)) from None
        if not isinstance(meta, dict):
            raise DatasetError(f"{self.yaml_path}: a YAML {type(meta).__name__} at the top level, "
                               "expected a mapping (dataset_name, graph, feature_data, tasks)")
        self.meta = meta
        self.name = str(meta.get("dataset_name") or self.root.name)
        graph = meta.get("graph")
        if not isinstance(graph, dict):
            hint = " (this is GraphBolt's preprocessed output: point at the original " \
                   "metadata.yaml)" if "graph_topology" in meta else ""
            raise DatasetError(f"{self.yaml_path}: no 'graph' section{hint}")
        nodes, edges = graph.get("nodes") or [], graph.get("edges") or []
        if not (isinstance(nodes, list) and isinstance(edges, list)
                and all(isinstance(e, dict) for e in nodes + edges)):
            raise DatasetError(f"{self.yaml_path}: graph.nodes and graph.edges must be lists of "
                               "mappings ({num: N} and {format, path}, each with a type if typed)")
        self.nodes, self.edges = nodes, edges

    def _key(self, entry: dict, key: str, where: str) -> Any:
        if not isinstance(entry, dict) or key not in entry:
            raise DatasetError(f"{self.yaml_path}: {where} has no {key!r}")
        return entry[key]

    def _count(self, entry: dict, where: str) -> int:
        num = self._key(entry, "num", where)
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise DatasetError(f"{self.yaml_path}: {where}.num is {shown(num, 100)}, expected a "
                               "positive integer (the number of nodes)")
        return num

    def _path(self, entry: dict, where: str) -> Path:
        """A file named by the metadata: relative, and inside the dataset's folder."""
        return contained(self.root, str(self._key(entry, "path", where)),
                         where=f"{self.yaml_path}: {where}.path")

    def _read(self, entry: dict, where: str) -> np.ndarray:
        """A numpy (memory-mapped) or torch file named by a metadata entry."""
        path = self._path(entry, where)
        fmt = self._key(entry, "format", where)
        if fmt == "numpy":
            return load_npy(path, where)
        if fmt == "torch":
            array = load_torch_file(path)
            if not isinstance(array, np.ndarray):
                raise DatasetError(f"{path}: holds a {type(array).__name__}, expected one saved tensor ({where})")
            return array
        raise DatasetError(f"{self.yaml_path}: {where} has format {fmt!r}, expected numpy or torch")

    def _edge_array(self, entry: dict, where: str) -> np.ndarray | None:
        """The (2, E) edges of a numpy-format entry, mapped; None for a CSV one."""
        if self._key(entry, "format", where) != "numpy":
            return None
        edges = load_npy(self._path(entry, where), "edges")
        if edges.ndim != 2 or edges.shape[0] != 2:
            raise DatasetError(f"{self._path(entry, where)}: shape {edges.shape}, expected "
                               f"(2, num_edges) ({where})")
        return edges

    def _edge_pairs(self, entry: dict, where: str) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) of an edge entry, numpy or "src,dst" CSV."""
        edges = self._edge_array(entry, where)
        if edges is not None:
            return np.asarray(edges[0]), np.asarray(edges[1])
        return csv_edges(require_file(self._path(entry, where)))

    def _pick_task(self, tasks: list[dict], name: str | None) -> dict:
        names = [t.get("name") for t in tasks]
        chosen = [t for t in tasks if name is None or t.get("name") == name]
        if len(chosen) != 1:
            raise DatasetError(f"{self.yaml_path}: tasks {names}; name one with --task"
                               if name is None and chosen else
                               f"{self.yaml_path}: no task {name!r} among tasks {names}")
        return chosen[0]

    def _seeds(self, data: dict[str, np.ndarray], key: str) -> np.ndarray:
        for name in SEED_NAMES:
            if name in data:
                return data[name]
        if not data:
            return np.empty(0, dtype=np.int64)
        raise DatasetError(f"{self.yaml_path}: {key} has data {sorted(map(str, data))}; expected "
                           f"node IDs named one of {SEED_NAMES}")

    def input_paths(self) -> list[Path]:
        """The dataset folder: metadata.yaml and every file it names (paths inside it only): what resume and the --out overlap check see."""
        return [self.root]


class GraphBoltSource(GraphBoltMetadata):
    def __init__(self, root: str | Path, task: str | None = None, feature: str = "feat",
                 symmetric: bool = False):
        super().__init__(root)
        self.symmetric = symmetric
        meta, nodes, edges = self.meta, self.nodes, self.edges
        if len(nodes) != 1 or len(edges) != 1 or "type" in nodes[0] or "type" in edges[0]:
            raise DatasetError(f"{self.yaml_path}: 'graph' has {len(nodes)} node and {len(edges)} "
                               "edge entries or typed ones; only homogeneous graphs (one untyped "
                               "entry each) are supported")
        self.num_nodes = self._count(nodes[0], "graph.nodes[0]")
        self._edge_spec = edges[0]
        self._edges = self._edge_array(edges[0], "graph.edges[0]")
        if self._edges is not None:
            self.num_edges = int(self._edges.shape[1])
        node_features = {f.get("name"): f for f in meta.get("feature_data") or []
                         if f.get("domain") == "node" and "type" not in f}
        if feature not in node_features:
            raise DatasetError(f"{self.yaml_path}: no node feature named {feature!r} in "
                               f"feature_data (has {sorted(map(str, node_features))})")
        self._features = self._read(node_features[feature], f"feature_data {feature!r}")
        if self._features.ndim != 2 or self._features.shape[0] != self.num_nodes:
            raise DatasetError(f"{self._path(node_features[feature], '')}: shape "
                               f"{self._features.shape}, expected ({self.num_nodes}, dim)")
        self.feat_dim = int(self._features.shape[1])
        self._task = self._pick_task(meta.get("tasks") or [], task)
        self._label_feature = node_features.get("label")

    def _set_arrays(self, split: str) -> dict[str, np.ndarray]:
        key = SETS[split]
        entries = self._task.get(key) or []
        if not entries:
            return {}
        if len(entries) != 1 or "type" in entries[0]:
            raise DatasetError(f"{self.yaml_path}: {key} has typed or several entries; expected one "
                               "untyped entry (homogeneous graph)")
        return {item.get("name"): np.asarray(self._read(item, f"{key} {item.get('name')!r}"))
                for item in self._key(entries[0], "data", key)}

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        return self._edge_pairs(self._edge_spec, "graph.edges[0]")

    def edge_chunks(self, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self._edges is None:
            src, dst = self.load_edges()
            yield src, dst
            return
        yield from mapped_edge_chunks(self._edges, chunk_edges, by_row=True)

    def load_labels(self) -> np.ndarray:
        if self._label_feature is not None:
            return np.asarray(self._read(self._label_feature, "feature_data 'label'")).reshape(-1)
        labels = np.full(self.num_nodes, -1, dtype=np.int64)
        for split, key in SETS.items():
            data = self._set_arrays(split)
            seeds = self._seeds(data, key)
            if "labels" not in data:
                raise DatasetError(f"{self.yaml_path}: {key} has no 'labels' and there is no "
                                   "node feature 'label'")
            if data["labels"].shape != seeds.shape:
                raise DatasetError(f"{self.yaml_path}: {key} has {data['labels'].shape} labels for "
                                   f"{seeds.shape} seeds")
            inside = (seeds >= 0) & (seeds < self.num_nodes)  # the writer reports the rest
            labels[seeds[inside]] = data["labels"][inside]
        return labels

    def load_splits(self) -> dict[str, np.ndarray]:
        return {split: self._seeds(self._set_arrays(split), key) for split, key in SETS.items()}

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        return slice_chunks(self._features, start_row, chunk_rows)

    def describe(self) -> dict[str, Any]:
        return {"kind": "graphbolt", "name": self.name, "task": self._task.get("name"),
                "symmetric": self.symmetric}
