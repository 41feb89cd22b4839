"""A synthetic node-classification graph of any size, generated in bounded memory.

Communities are the labels. Edges follow a Chung-Lu model with power-law node weights
(so degrees are power-law), and a `homophily` fraction of each node's edges stays
inside its community. Optionally a `local_fraction` of edges stays inside small
neighbourhoods of `local_size` nodes nested in the communities: the locality real graphs
have (co-purchases, citations within a field) and a locality node order can exploit.
Node IDs are in random order either way, so the original order has no locality. Features are a class centroid plus Gaussian noise, with the
centroids close enough that a single node's features are a weak signal: averaging
over same-class neighbours is what lifts accuracy, so a GNN clearly beats an MLP.

Every part is a function of (seed, node range): features are generated chunk by chunk
and never held whole, so a preprocess can stream 50M+ nodes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError

FEATURE_BLOCK = 1 << 16  # rows generated per RNG stream: fixes the output whatever the chunking
EDGE_BLOCK = 1 << 20  # edges drawn per step: bounds the temporaries to ~50 MiB


@dataclass(frozen=True)
class SyntheticSpec:
    num_nodes: int
    feat_dim: int = 128
    num_classes: int = 16
    avg_degree: float = 15.0
    power_law_exponent: float = 2.5
    homophily: float = 0.8
    local_fraction: float = 0.0
    local_size: int = 1024
    feature_signal: float = 1.0
    train_fraction: float = 0.1
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("num_nodes", self.num_nodes >= 2, "at least 2"),
            ("feat_dim", self.feat_dim >= 1, "at least 1"),
            ("num_classes", 2 <= self.num_classes <= min(self.num_nodes, 32767), "2..min(nodes, 32767)"),
            ("avg_degree", self.avg_degree > 0, "positive"),
            ("power_law_exponent", self.power_law_exponent > 2, "above 2"),
            ("homophily", 0 <= self.homophily <= 1, "in [0, 1]"),
            ("local_fraction", 0 <= self.local_fraction <= 1, "in [0, 1]"),
            ("local_size", self.local_size >= 2, "at least 2"),
            ("feature_signal", self.feature_signal >= 0, "non-negative"),
            ("train_fraction", 0 < self.train_fraction, "positive"),
            ("fractions", self.train_fraction + self.valid_fraction + self.test_fraction <= 1,
             "train + valid + test at most 1"),
        ]
        for key, ok, expected in checks:
            if not ok:
                raise DatasetError(f"synthetic: {key} = {getattr(self, key, None)!r}; expected {expected}")


#: Named sizes (documented in datasets/README.md).
PRESETS: dict[str, SyntheticSpec] = {
    "tiny": SyntheticSpec(num_nodes=5_000, feat_dim=32, num_classes=8, avg_degree=10,
                          train_fraction=0.3, valid_fraction=0.1, test_fraction=0.2),
    "small": SyntheticSpec(num_nodes=100_000, feat_dim=64, num_classes=16, avg_degree=15,
                           train_fraction=0.2, valid_fraction=0.05, test_fraction=0.1),
    "medium": SyntheticSpec(num_nodes=2_500_000, feat_dim=128, num_classes=32, avg_degree=15),
    "large": SyntheticSpec(num_nodes=20_000_000, feat_dim=128, num_classes=64, avg_degree=15),
}


class SyntheticSource:
    """DatasetSource for SyntheticSpec."""

    symmetric = True

    def __init__(self, spec: SyntheticSpec, name: str = "synthetic"):
        self.spec = spec
        self.name = name
        self.num_nodes = spec.num_nodes
        self.feat_dim = spec.feat_dim
        root = np.random.default_rng([spec.seed, 0])
        self._labels = root.integers(spec.num_classes, size=spec.num_nodes, dtype=np.int16)
        spread = spec.feature_signal / np.sqrt(2 * spec.feat_dim)
        self._centroids = (root.standard_normal((spec.num_classes, spec.feat_dim)) * spread
                           ).astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {"kind": "synthetic", **asdict(self.spec)}

    def load_labels(self) -> np.ndarray:
        return self._labels

    def neighbourhood_order(self) -> np.ndarray:
        """The nodes in the generator's own layout: by community, each community's
        neighbourhoods as runs of local_size consecutive nodes. The oracle that a locality
        node order is measured against (node IDs themselves are in random order)."""
        return np.argsort(self._labels, kind="stable")

    def load_splits(self) -> dict[str, np.ndarray]:
        s = self.spec
        order = np.random.default_rng([s.seed, 1]).permutation(s.num_nodes)
        a = int(s.train_fraction * s.num_nodes)
        b = a + int(s.valid_fraction * s.num_nodes)
        c = b + int(s.test_fraction * s.num_nodes)
        return {"train": order[:a], "valid": order[a:b], "test": order[b:c]}

    def _weights(self) -> np.ndarray:
        s = self.spec
        u = np.random.default_rng([s.seed, 2]).random(s.num_nodes)
        w = (1.0 - u) ** (-1.0 / (s.power_law_exponent - 1.0))
        return np.minimum(w, np.sqrt(s.num_nodes * s.avg_degree))  # no node above ~sqrt(2E)

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Each undirected edge once (the store adds the reverse): N * avg_degree / 2 edges."""
        s = self.spec
        n = s.num_nodes
        num_edges = int(n * s.avg_degree / 2)
        id_dtype = np.int32 if n < 2**31 else np.int64
        weights = self._weights()
        # Nodes grouped by community, with cumulative weights: sampling a node from a range
        # of positions proportional to weight is one searchsorted inside that range.
        # Neighbourhoods are runs of local_size positions inside a community.
        by_class = np.argsort(self._labels, kind="stable")
        cum = np.cumsum(weights[by_class])
        class_end = np.cumsum(np.bincount(self._labels, minlength=s.num_classes))
        class_start = class_end - np.bincount(self._labels, minlength=s.num_classes)
        src = np.empty(num_edges, dtype=id_dtype)
        dst = np.empty(num_edges, dtype=id_dtype)
        for k, lo in enumerate(range(0, num_edges, EDGE_BLOCK)):
            m = min(EDGE_BLOCK, num_edges - lo)
            rng = np.random.default_rng([s.seed, 3, k])
            pos = np.searchsorted(cum, rng.random(m) * cum[-1], side="right").clip(max=n - 1)
            c = self._labels[by_class[pos]]
            u = rng.random(m)
            first, last = np.zeros(m, np.int64), np.full(m, n, np.int64)  # position range of b
            inside = u < s.homophily + s.local_fraction * (1 - s.homophily)
            first[inside], last[inside] = class_start[c[inside]], class_end[c[inside]]
            local = u < s.local_fraction
            first[local] += (pos[local] - first[local]) // s.local_size * s.local_size
            last[local] = np.minimum(first[local] + s.local_size, last[local])
            lo_w = np.where(first > 0, cum[first - 1], 0.0)
            draw = lo_w + rng.random(m) * (cum[last - 1] - lo_w)
            b = np.searchsorted(cum, draw, side="right").clip(max=n - 1)
            src[lo:lo + m], dst[lo:lo + m] = by_class[pos], by_class[b]
        loops = src == dst
        return src[~loops], dst[~loops]

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """Rows from `start_row` on, one RNG stream per FEATURE_BLOCK rows."""
        s = self.spec
        for block in range(start_row // FEATURE_BLOCK, -(-s.num_nodes // FEATURE_BLOCK)):
            lo = block * FEATURE_BLOCK
            hi = min(lo + FEATURE_BLOCK, s.num_nodes)
            rng = np.random.default_rng([s.seed, 4, block])
            rows = rng.standard_normal((hi - lo, s.feat_dim), dtype=np.float32)
            rows += self._centroids[self._labels[lo:hi]]
            yield rows[max(start_row - lo, 0):]


def synthetic_source(preset: str | None = None, **overrides: Any) -> SyntheticSource:
    """A preset, or a spec from scratch (`num_nodes` required), with fields overridden."""
    if preset is not None:
        if preset not in PRESETS:
            raise DatasetError(f"synthetic preset {preset!r}: expected one of {sorted(PRESETS)}")
        spec = asdict(PRESETS[preset])
    elif "num_nodes" not in overrides:
        raise DatasetError("synthetic: give a preset or num_nodes")
    else:
        spec = {}
    spec.update({k: v for k, v in overrides.items() if v is not None})
    return SyntheticSource(SyntheticSpec(**spec), name=f"synthetic-{preset or spec['num_nodes']}")
