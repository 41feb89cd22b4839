"""OGB's binary node-property layout, as ogbn-papers100M ships it (read by OGB's
`read_binary_graph_raw`):

    ROOT/raw/data.npz        edge_index (2, E) int64, node_feat (N, D), num_nodes_list [N],
                             num_edges_list [E] (node_year etc. ignored)
    ROOT/raw/node-label.npz  node_label (N,) or (N, 1), NaN for an unlabelled node
    ROOT/split/NAME/{train,valid,test}.csv.gz  node IDs, one per line

Edges and features are streamed out of the zip members (stored or deflated) in blocks:
papers100M's 1.6B edges and 57 GB of features are never in memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError

from .npz_stream import NpzMember
from .ogb_layout import read_splits, resolve_split_name


class OGBBinarySource:
    def __init__(self, root: str | Path, split_name: str | None = None, symmetric: bool = False):
        self.root = Path(root)
        self.name = self.root.name
        self.symmetric = symmetric
        self.split_name = resolve_split_name(self.root, split_name)
        data = self.root / "raw" / "data.npz"
        self._edges = NpzMember(data, "edge_index")
        self._edges.expect((2, None), "(2, num_edges) integers")
        self._features = NpzMember(data, "node_feat")
        self._features.expect((None, None), "(num_nodes, feat_dim) numbers")
        self.num_nodes, self.feat_dim = self._features.shape
        self.num_edges = self._edges.shape[1]
        for member, total, what in (("num_nodes_list", self.num_nodes, "node_feat rows"),
                                    ("num_edges_list", self.num_edges, "edge_index columns")):
            counts = NpzMember(data, member)
            counts.expect((1,), "one count (a single graph)")
            declared = int(counts.read()[0])
            if declared != total:
                raise DatasetError(f"{counts}: {declared}, but there are {total} {what}")
        self._label_member = NpzMember(self.root / "raw" / "node-label.npz", "node_label")
        if self._label_member.shape not in ((self.num_nodes,), (self.num_nodes, 1)):
            raise DatasetError(f"{self._label_member}: shape {self._label_member.shape}, expected "
                               f"({self.num_nodes},) or ({self.num_nodes}, 1): one per node_feat row")
        self._label_member.expect(self._label_member.shape, "numbers (NaN: unlabelled)")

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        src = np.empty(self.num_edges, dtype=self._edges.dtype)
        dst = np.empty_like(src)
        lo = 0
        for block_src, block_dst in self.edge_chunks(1 << 22):
            src[lo:lo + len(block_src)], dst[lo:lo + len(block_dst)] = block_src, block_dst
            lo += len(block_src)
        return src, dst

    def edge_chunks(self, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self._edges.pair_blocks(chunk_edges)

    def load_labels(self) -> np.ndarray:
        return self._label_member.read().reshape(-1)

    def load_splits(self) -> dict[str, np.ndarray]:
        splits = read_splits(self.root, self.split_name)
        labels = self.load_labels()
        for name, ids in splits.items():
            inside = ids[(ids >= 0) & (ids < self.num_nodes)]  # the writer reports the rest
            unlabelled = np.isnan(labels[inside]) if labels.dtype.kind == "f" else labels[inside] < 0
            if unlabelled.any():
                count = "all" if unlabelled.all() else f"{int(unlabelled.sum())} of"
                raise DatasetError(
                    f"{self.root / 'split' / self.split_name / f'{name}.csv.gz'}: {count} "
                    f"{ids.size} nodes of split {name!r} are unlabelled (NaN) in "
                    f"{self._label_member}, e.g. node {inside[unlabelled][0]}")
        return splits

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        return self._features.row_blocks(start_row, chunk_rows)

    def input_paths(self) -> list[Path]:
        """Raw/ and split/: what resume and the --out overlap check see."""
        return [self.root]

    def describe(self) -> dict[str, Any]:
        return {"kind": "ogb", "layout": "binary", "name": self.name, "split": self.split_name,
                "symmetric": self.symmetric}
