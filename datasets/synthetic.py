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

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, NamedTuple, TypeVar

import numba
import numpy as np

from gnnssd.storage_format import DatasetError
from gnnssd.storage_format import index_dtype

FEATURE_BLOCK = 1 << 16  # rows generated per RNG stream: fixes the output whatever the chunking
EDGE_BLOCK = 1 << 20  # edges drawn per RNG stream: fixes the graph whatever the chunking
#: Blocks of edges or feature rows generated at once (numba and NumPy's generators release the GIL).
DRAW_THREADS = 2
#: Entries of the table that narrows each weighted draw to a few nodes of `cum` (a plain
#: binary search over 10^8 nodes is ~27 cache misses; the table leaves one or two).
SEARCH_STEPS = 1 << 22
T = TypeVar("T")


class _Layout(NamedTuple):
    """Nodes grouped by community (positions), with cumulative weights along them."""

    by_class: np.ndarray  # position -> node ID
    cum: np.ndarray  # float64, cumulative weight up to and including each position
    table: np.ndarray  # table[k]: the first position whose cum exceeds k * cum[-1] / steps
    class_start: np.ndarray
    class_end: np.ndarray


@numba.njit(cache=True, nogil=True)
def _weighted_position(cum, table, x, lo, hi):
    """The first position in [lo, hi) whose cumulative weight exceeds x, else hi - 1 (as
    `np.searchsorted(cum, x, side="right")` clipped into the range), narrowed by `table`."""
    steps = table.shape[0] - 1
    k = min(max(int(x * (steps / cum[-1])), 0), steps - 1)
    a, b = max(table[k], lo), min(table[k + 1], hi - 1)
    while a > lo and cum[a - 1] > x:  # the table's float rounding, corrected
        a -= 1
    while b < hi - 1 and cum[b] <= x:
        b += 1
    a = min(a, b)
    while a < b:  # first index in [a, b] with cum > x, b if none before it
        mid = (a + b) // 2
        if cum[mid] > x:
            b = mid
        else:
            a = mid + 1
    return a


@numba.njit(cache=True, nogil=True)
def _draw_edges(pick, kind, draw, cum, table, by_class, class_start, class_end, homophily,
                local_fraction, local_size, src, dst):
    """Edge i: endpoint a at a position drawn by weight (`pick[i]`); endpoint b by weight
    inside a's community (`kind[i]` < homophily share) or a's neighbourhood of `local_size`
    positions (`kind[i]` < local_fraction), else anywhere (`draw[i]`). A self-loop is moved
    to the next position of the same range, so every block has exactly its edge count."""
    n = cum.shape[0]
    inside_share = homophily + local_fraction * (1.0 - homophily)
    for i in range(pick.shape[0]):
        pos = _weighted_position(cum, table, pick[i] * cum[-1], 0, n)
        first, last = 0, n
        if kind[i] < inside_share:
            c = np.searchsorted(class_end, pos, side="right")
            first, last = class_start[c], class_end[c]
            if kind[i] < local_fraction:
                first += (pos - first) // local_size * local_size
                last = min(first + local_size, last)
        lo_w = cum[first - 1] if first > 0 else 0.0
        b = _weighted_position(cum, table, lo_w + draw[i] * (cum[last - 1] - lo_w), first, last)
        if b == pos:
            b = first + (b - first + 1) % (last - first) if last - first > 1 else (b + 1) % n
        src[i], dst[i] = by_class[pos], by_class[b]


def _in_order(make: Callable[[int], T], keys: Iterable[int]) -> Iterator[T]:
    """make(k) for each key, in order, computed DRAW_THREADS at a time (and one ahead)."""
    with ThreadPoolExecutor(DRAW_THREADS) as pool:
        pending: deque = deque()
        for k in keys:
            pending.append(pool.submit(make, k))
            if len(pending) > DRAW_THREADS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _split(pair: tuple[np.ndarray, np.ndarray], size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    src, dst = pair
    for lo in range(0, src.shape[0], size):
        yield src[lo:lo + size], dst[lo:lo + size]


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic graph's shape (see the module docstring); checked when made."""

    num_nodes: int
    feat_dim: int = 128
    num_classes: int = 16
    avg_degree: float = 15.0
    #: Of the power-law degree distribution (above 2: a finite mean degree).
    power_law_exponent: float = 2.5
    #: Share of a node's edges inside its community (its class), of those not local.
    homophily: float = 0.8
    #: Share of edges inside the node's neighbourhood of `local_size` positions (in its community).
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
    # Shaped like ogbn-papers100M made symmetric: 111M nodes, > 2^31 CSC edges, 172 classes,
    # its 1.1 / 0.1 / 0.2 % splits; float16 rows (28 GB: more than this machine's memory).
    "papers": SyntheticSpec(num_nodes=111_000_000, feat_dim=128, num_classes=172, avg_degree=22,
                            train_fraction=0.011, valid_fraction=0.001, test_fraction=0.002),
    "papers-mini": SyntheticSpec(num_nodes=2_220_000, feat_dim=128, num_classes=172, avg_degree=22,
                                 train_fraction=0.011, valid_fraction=0.001, test_fraction=0.002),
}
#: Feature dtype on disk when preprocess is not given one (float32 for presets not listed).
PRESET_DTYPES = {"papers": "float16", "papers-mini": "float16"}


class SyntheticSource:
    """DatasetSource for SyntheticSpec."""

    symmetric = True
    #: What preprocess writes the features as unless told otherwise.
    default_dtype = "float32"

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

    @property
    def num_edges(self) -> int:
        """Each undirected edge once (the store adds the reverse): N * avg_degree / 2."""
        return int(self.spec.num_nodes * self.spec.avg_degree / 2)

    def _layout(self) -> _Layout:
        """The sampling tables (about 20 B per node), built for each pass over the edges
        rather than kept: preprocess's later steps need the memory (1.4 GB for papers)."""
        s = self.spec
        n = s.num_nodes
        by_class = np.argsort(self._labels, kind="stable").astype(index_dtype(n))
        cum = np.cumsum(self._weights()[by_class])
        sizes = np.bincount(self._labels, minlength=s.num_classes)
        class_end = np.cumsum(sizes)
        steps = min(SEARCH_STEPS, n)
        table = np.searchsorted(cum, np.arange(steps + 1) * (cum[-1] / steps), side="right")
        return _Layout(by_class, cum, table.astype(np.int64), class_end - sizes, class_end)

    def edge_chunks(self, chunk_edges: int = EDGE_BLOCK) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The edges, EDGE_BLOCK at a time (one RNG stream per block, so the graph does not
        depend on `chunk_edges`); blocks are drawn by two threads (the kernel releases the GIL)."""
        s = self.spec
        layout = self._layout()
        total = self.num_edges
        blocks = range(-(-total // EDGE_BLOCK))

        def draw(k: int) -> tuple[np.ndarray, np.ndarray]:
            m = min(EDGE_BLOCK, total - k * EDGE_BLOCK)
            rng = np.random.default_rng([s.seed, 3, k])
            pick, kind, draw_b = rng.random(m), rng.random(m), rng.random(m)
            src = np.empty(m, dtype=layout.by_class.dtype)
            dst = np.empty(m, dtype=layout.by_class.dtype)
            _draw_edges(pick, kind, draw_b, layout.cum, layout.table, layout.by_class,
                        layout.class_start, layout.class_end, s.homophily, s.local_fraction,
                        s.local_size, src, dst)
            return src, dst

        for pair in _in_order(draw, blocks):
            yield from _split(pair, chunk_edges)

    def load_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Every edge at once (the stream of `edge_chunks`, concatenated)."""
        parts = list(self.edge_chunks())
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def feature_chunks(self, start_row: int, chunk_rows: int) -> Iterator[np.ndarray]:
        """Rows from `start_row` on, one RNG stream per FEATURE_BLOCK rows (drawn by
        DRAW_THREADS threads)."""
        s = self.spec

        def rows(block: int) -> np.ndarray:
            lo = block * FEATURE_BLOCK
            hi = min(lo + FEATURE_BLOCK, s.num_nodes)
            rng = np.random.default_rng([s.seed, 4, block])
            out = rng.standard_normal((hi - lo, s.feat_dim), dtype=np.float32)
            out += self._centroids[self._labels[lo:hi]]
            return out[max(start_row - lo, 0):]

        yield from _in_order(rows, range(start_row // FEATURE_BLOCK, -(-s.num_nodes // FEATURE_BLOCK)))


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
    source = SyntheticSource(SyntheticSpec(**spec), name=f"synthetic-{preset or spec['num_nodes']}")
    source.default_dtype = PRESET_DTYPES.get(preset or "", "float32")
    return source
