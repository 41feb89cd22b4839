"""The raw on-disk layout of OGB link-property-prediction datasets (ogbl-collab, ogbl-citation2).

    ROOT/raw/edge.csv.gz            one "src,dst" line per training-graph edge
    ROOT/raw/node-feat.csv.gz       one line of comma-separated floats per node
    ROOT/raw/num-node-list.csv.gz   the node count
    ROOT/split/NAME/{train,valid,test}.pt   torch-saved dicts of tensors, either
        {"edge": (E, 2), "edge_neg": (E', 2), ...}                    (ogbl-collab)
        {"source_node": (E,), "target_node": (E,), "target_node_neg": (E, K)}  (ogbl-citation2)

The .pt files are read by `torch_file`: tensors and plain values only, nothing they name
can run. Evaluation negatives are the layout's per-edge
`target_node_neg` where it has them; where it has only shared negative pairs (collab's
`edge_neg`), every evaluation edge gets K seeded uniform negative destinations instead, so
all stores rank each edge against its own fixed negatives (ogbl-citation2's protocol).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gnnssd.storage_format import DatasetError
from gnnssd.storage_format import LinkSplit, random_negatives

from .ogb import OGBSource, csv_feature_dim
from .ogb_layout import read_column, resolve_split_name
from .torch_file import load_torch_file

DEFAULT_NEGATIVES = 1000


class OGBLinkSource(OGBSource):
    """An ogbl-* dataset: features and graph as for ogbn-*, no node labels, a link split."""

    def __init__(self, root: str | Path, split_name: str | None = None, symmetric: bool = False,
                 eval_negatives: int = DEFAULT_NEGATIVES, seed: int = 0):
        self.root = Path(root)
        self.name = self.root.name
        self.symmetric = symmetric
        self.split_name = resolve_split_name(self.root, split_name)
        self.eval_negatives = eval_negatives
        self.seed = seed
        self.num_nodes = int(read_column(self._raw("num-node-list.csv.gz"), np.int64).sum())
        self.feat_dim = csv_feature_dim(self._raw("node-feat.csv.gz"))

    def load_labels(self) -> np.ndarray:
        return np.full(self.num_nodes, -1, np.int64)

    def load_splits(self) -> dict[str, np.ndarray]:
        return {}

    def load_link_split(self) -> LinkSplit:
        parts = {name: self._load_part(name) for name in ("train", "valid", "test")}
        edges = {name: _edge_pairs(part, self._part_path(name)) for name, part in parts.items()}
        rng = np.random.default_rng(self.seed)
        negatives = {}
        for name in ("valid", "test"):
            given = parts[name].get("target_node_neg")
            negatives[name] = (np.asarray(given, np.int64).reshape(len(edges[name]), -1)
                               if given is not None else
                               random_negatives(edges[name][:, 1], self.eval_negatives, self.num_nodes, rng))
        return LinkSplit(edges, negatives)

    def _part_path(self, name: str) -> Path:
        return self.root / "split" / self.split_name / f"{name}.pt"

    def _load_part(self, name: str) -> dict[str, np.ndarray]:
        path = self._part_path(name)
        part = load_torch_file(path)
        if not isinstance(part, dict):
            raise DatasetError(f"{path}: expected a dict of tensors, got {type(part).__name__}")
        return {k: np.asarray(v) for k, v in part.items()}

    def describe(self) -> dict[str, Any]:
        return {"kind": "ogb-link", "name": self.name, "split": self.split_name,
                "symmetric": self.symmetric, "eval_negatives": self.eval_negatives, "seed": self.seed}


def _edge_pairs(part: dict[str, np.ndarray], path: Path) -> np.ndarray:
    """(E, 2) pairs from either layout's keys."""
    if "edge" in part:
        return np.asarray(part["edge"]).reshape(-1, 2)
    if "source_node" in part and "target_node" in part:
        return np.stack([np.asarray(part["source_node"]), np.asarray(part["target_node"])], axis=1)
    raise DatasetError(f"{path}: keys {sorted(part)}; expected 'edge' (ogbl-collab) or "
                       "'source_node' and 'target_node' (ogbl-citation2)")
