"""Edge splits for link prediction: held-out valid/test edges and fixed evaluation negatives.

A split is either drawn at random from the graph's edges (`random_link_split`) or given
by the dataset (OGB's link layouts). Either way the valid and test edges are removed
from the stored graph in both directions (`held_out_mask`), so neither training nor
evaluation can see them as neighbours, and every evaluation edge gets the same fixed
negatives on every run (ogbl-citation2's protocol: the destination corrupted).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DatasetError

LINK_SPLITS = ("train", "valid", "test")
EVAL_SPLITS = ("valid", "test")


@dataclass
class LinkSplit:
    """Edges as (E, 2) int64 arrays of (source, destination) node IDs per split, and
    (E, K) negative destinations per evaluation edge."""

    edges: dict[str, np.ndarray]
    negatives: dict[str, np.ndarray]

    def arrays(self) -> dict[str, np.ndarray]:
        """The store's array files: link_train, link_valid, link_valid_neg, ..."""
        out = {f"link_{name}": self.edges[name] for name in LINK_SPLITS}
        out.update({f"link_{name}_neg": self.negatives[name] for name in EVAL_SPLITS})
        return out

    def renumbered(self, inv: np.ndarray) -> "LinkSplit":
        """The same split in store IDs (inv[original] = store ID)."""
        return LinkSplit({k: inv[v] for k, v in self.edges.items()},
                         {k: inv[v] for k, v in self.negatives.items()})


def parse_fractions(text: str) -> tuple[float, float, float]:
    """'0.85,0.05,0.10' -> (0.85, 0.05, 0.1); three non-negative numbers summing to 1."""
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) < 0 or abs(sum(parts) - 1) > 1e-6 or parts[0] == 0:
        raise DatasetError(f"--edge-split {text!r}: expected three fractions train,valid,test "
                           "summing to 1 with train > 0, e.g. 0.85,0.05,0.10")
    return parts  # type: ignore[return-value]


def pair_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """One int64 key per unordered pair {src, dst}: an edge and its reverse share it."""
    lo, hi = np.minimum(src, dst).astype(np.int64), np.maximum(src, dst).astype(np.int64)
    return lo * num_nodes + hi


def random_negatives(dst: np.ndarray, k: int, num_nodes: int, rng: np.random.Generator) -> np.ndarray:
    """k destinations per edge drawn uniformly from every node but the edge's own
    destination: a negative never equals its positive."""
    draw = rng.integers(0, num_nodes - 1, size=(len(dst), k), dtype=np.int64)
    return draw + (draw >= np.asarray(dst, np.int64)[:, None])


def random_link_split(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                      fractions: tuple[float, float, float], seed: int,
                      eval_negatives: int) -> LinkSplit:
    """Split the graph's distinct undirected pairs (self-loops left out) at random."""
    keys = pair_keys(src, dst, num_nodes)
    pairs = np.unique(keys[src != dst])
    if len(pairs) < 3:
        raise DatasetError(f"--edge-split: the graph has {len(pairs)} distinct edges; need at least 3")
    rng = np.random.default_rng(seed)
    pairs = rng.permutation(pairs)
    n_valid = int(round(fractions[1] * len(pairs)))
    n_test = int(round(fractions[2] * len(pairs)))
    parts = {"valid": pairs[:n_valid], "test": pairs[n_valid:n_valid + n_test],
             "train": pairs[n_valid + n_test:]}
    edges = {name: np.stack([p // num_nodes, p % num_nodes], axis=1) for name, p in parts.items()}
    negatives = {name: random_negatives(edges[name][:, 1], eval_negatives, num_nodes, rng)
                 for name in EVAL_SPLITS}
    return LinkSplit(edges, negatives)


def held_out_mask(src: np.ndarray, dst: np.ndarray, num_nodes: int, split: LinkSplit) -> np.ndarray:
    """True for the graph edges that are valid or test edges, in either direction."""
    held = np.concatenate([pair_keys(split.edges[s][:, 0], split.edges[s][:, 1], num_nodes)
                           for s in EVAL_SPLITS])
    return np.isin(pair_keys(src, dst, num_nodes), held)


def checked_link_split(split: LinkSplit, num_nodes: int, name: str) -> LinkSplit:
    """Shapes, dtypes and ranges of a dataset-provided split, with errors naming the array."""
    for kind, arrays in (("edges", split.edges), ("negatives", split.negatives)):
        for part, array in arrays.items():
            what = f"{name}: link {part} {kind}"
            if array.ndim != 2 or (kind == "edges" and array.shape[1] != 2):
                raise DatasetError(f"{what} have shape {array.shape}, expected "
                                   f"{'(E, 2)' if kind == 'edges' else '(E, K)'}")
            if array.size and array.dtype.kind not in "iu":
                raise DatasetError(f"{what} have dtype {array.dtype}, expected integers")
            bad = array[(array < 0) | (array >= num_nodes)]
            if bad.size:
                raise DatasetError(f"{what} hold node {bad[0]}, outside 0..{num_nodes - 1}")
    for part in EVAL_SPLITS:
        if len(split.negatives[part]) != len(split.edges[part]):
            raise DatasetError(f"{name}: {len(split.negatives[part])} rows of {part} negatives "
                               f"for {len(split.edges[part])} {part} edges")
    return LinkSplit({k: v.astype(np.int64) for k, v in split.edges.items()},
                     {k: v.astype(np.int64) for k, v in split.negatives.items()})
