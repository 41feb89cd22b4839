"""A small heterogeneous graph for tests, held as plain arrays: the TypedSource the store is
written from, and the DGLHeteroGraph the tests compare the store's sampling against."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format.schema import GraphSchema, NodeType

RELATIONS = (("paper", "cites", "paper"), ("author", "writes", "paper"),
             ("paper", "written_by", "author"), ("author", "affiliated_with", "institution"),
             ("institution", "employs", "author"))


class ToyHeteroSource:
    """Papers (with features and labels), featureless authors and institutions; every
    relation drawn at random (repeats included: the store keeps each pair once)."""

    symmetric = False

    def __init__(self, papers: int = 300, authors: int = 200, institutions: int = 20,
                 feat_dim: int = 8, classes: int = 4, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.name = "toy-hetero"
        self.schema = GraphSchema((NodeType("paper", papers, True), NodeType("author", authors, False),
                                   NodeType("institution", institutions, False)), RELATIONS, "paper")
        self.num_nodes = self.schema.num_nodes
        self.feat_dim = feat_dim
        off = self.schema.offsets
        cites = (rng.integers(0, papers, 4 * papers), rng.integers(0, papers, 4 * papers))
        writes = (rng.integers(0, authors, 3 * papers) + off[1], rng.integers(0, papers, 3 * papers))
        works = (rng.integers(0, authors, authors) + off[1], rng.integers(0, institutions, authors) + off[2])
        self.edges = [cites, writes, writes[::-1], works, works[::-1]]
        self.features = rng.standard_normal((papers, feat_dim)).astype(np.float32)
        self.labels = np.full(self.num_nodes, -1, np.int64)
        self.labels[:papers] = rng.integers(0, classes, papers)
        order = rng.permutation(papers)
        self.splits = {"train": order[: papers // 2], "valid": order[papers // 2: 3 * papers // 4],
                       "test": order[3 * papers // 4:]}

    def load_relation_edges(self, relation: int) -> tuple[np.ndarray, np.ndarray]:
        return self.edges[relation]

    def load_labels(self) -> np.ndarray:
        return self.labels

    def load_splits(self) -> dict[str, np.ndarray]:
        return self.splits

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        for lo in range(start_row, len(self.features), chunk_rows):
            yield self.features[lo:lo + chunk_rows]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": self.num_nodes}

    def dgl_graph(self) -> Any:
        """The same graph as a DGLHeteroGraph in type-local IDs (each pair once)."""
        import dgl
        import torch

        off = self.schema.offsets
        data = {}
        for (s, r, d), (src, dst) in zip(RELATIONS, self.edges):
            pairs = np.unique(np.stack([src - off[self.schema.type_id(s)],
                                        dst - off[self.schema.type_id(d)]], 1), axis=0)
            data[(s, r, d)] = (torch.from_numpy(pairs[:, 0]), torch.from_numpy(pairs[:, 1]))
        counts = {t.name: t.count for t in self.schema.node_types}
        return dgl.heterograph(data, num_nodes_dict=counts)
