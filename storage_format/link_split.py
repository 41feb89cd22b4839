"""Edge splits for link prediction: held-out valid/test edges and fixed evaluation negatives.

A split is either drawn at random from the graph's edges (`random_link_split`) or given
by the dataset (OGB's link layouts). Either way the valid and test edges are removed
from the stored graph in both directions (`held_out_mask`), so neither training nor
evaluation can see them as neighbours, and every evaluation edge gets the same fixed
negatives on every run (ogbl-citation2's protocol: the destination corrupted).

On a heterogeneous graph the split is of one relation's edges (`relation_link_split`),
and a held-out pair {u, v} leaves every relation in both directions: u -> v of the
relation itself and v -> u of its reverse (rev_NAME, cited_by, written_by: whichever
relation holds it), so reverses are paired by their node pair, not by relation names,
as the sampler excludes a training batch's own edges (sampler.sampling.exclusion_keys).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import DatasetError
from .schema import GraphSchema

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


def split_relation(schema: GraphSchema, name: str | None, source: str) -> int:
    """The index of the relation an edge split of `source`'s typed graph is on: `name`,
    required when the graph has several relations (the writer's schema_parts refuses a
    name for a homogeneous graph, which has one relation and no names)."""
    names = [r for _, r, _ in schema.relations]
    if name is None:
        if len(names) == 1:
            return 0
        raise DatasetError(f"{source}: --edge-split on a heterogeneous graph splits one relation; "
                           f"name it with --edge-split-relation, one of {names}")
    if name not in names:
        raise DatasetError(f"{source}: --edge-split-relation {name!r} is not a relation of the graph; "
                           f"its relations are {names}")
    return names.index(name)


def pair_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """One int64 key per unordered pair {src, dst}: an edge and its reverse share it."""
    lo, hi = np.minimum(src, dst).astype(np.int64), np.maximum(src, dst).astype(np.int64)
    return lo * num_nodes + hi


def random_negatives(dst: np.ndarray, k: int, count: int, rng: np.random.Generator,
                     first: int = 0) -> np.ndarray:
    """k destinations per edge drawn uniformly from the nodes first..first+count-1 (all
    nodes, or a node type's range) but the edge's own destination: a negative never
    equals its positive."""
    draw = first + rng.integers(0, count - 1, size=(len(dst), k), dtype=np.int64)
    return draw + (draw >= np.asarray(dst, np.int64)[:, None])


def _cut(edges: np.ndarray, fractions: tuple[float, float, float],
         rng: np.random.Generator) -> dict[str, np.ndarray]:
    """(E, 2) edges permuted and cut into valid, test and train by `fractions`."""
    edges = edges[rng.permutation(len(edges))]
    n_valid = int(round(fractions[1] * len(edges)))
    n_test = int(round(fractions[2] * len(edges)))
    return {"valid": edges[:n_valid], "test": edges[n_valid:n_valid + n_test],
            "train": edges[n_valid + n_test:]}


def random_link_split(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                      fractions: tuple[float, float, float], seed: int,
                      eval_negatives: int) -> LinkSplit:
    """Split the graph's distinct undirected pairs (self-loops left out) at random."""
    keys = pair_keys(src, dst, num_nodes)
    pairs = np.unique(keys[src != dst])
    if len(pairs) < 3:
        raise DatasetError(f"--edge-split: the graph has {len(pairs)} distinct edges; need at least 3")
    rng = np.random.default_rng(seed)
    edges = _cut(np.stack([pairs // num_nodes, pairs % num_nodes], axis=1), fractions, rng)
    negatives = {name: random_negatives(edges[name][:, 1], eval_negatives, num_nodes, rng)
                 for name in EVAL_SPLITS}
    return LinkSplit(edges, negatives)


def relation_link_split(src: np.ndarray, dst: np.ndarray, num_nodes: int, dst_nodes: tuple[int, int],
                        fractions: tuple[float, float, float], seed: int, eval_negatives: int,
                        relation: str) -> LinkSplit:
    """Split one relation's edges (global IDs) at random: its distinct node pairs
    (self-loops left out; a pair listed both ways counts once), each edge in the direction
    the relation has it, with negatives drawn from the destination type's nodes
    `dst_nodes` (first, count)."""
    keys = pair_keys(src, dst, num_nodes)
    _, first = np.unique(np.where(src != dst, keys, -1), return_index=True)
    first = first[src[first] != dst[first]]
    if len(first) < 3:
        raise DatasetError(f"--edge-split: relation {relation!r} has {len(first)} distinct edges; "
                           "need at least 3")
    if dst_nodes[1] < 2:
        raise DatasetError(f"--edge-split: relation {relation!r} ends at a node type of {dst_nodes[1]} "
                           "node(s); negatives need at least 2")
    rng = np.random.default_rng(seed)
    edges = _cut(np.stack([src[first], dst[first]], axis=1).astype(np.int64), fractions, rng)
    negatives = {name: random_negatives(edges[name][:, 1], eval_negatives, dst_nodes[1], rng, dst_nodes[0])
                 for name in EVAL_SPLITS}
    return LinkSplit(edges, negatives)


def held_out_mask(src: np.ndarray, dst: np.ndarray, num_nodes: int, split: LinkSplit) -> np.ndarray:
    """True for the graph edges that are valid or test edges, in either direction (on a
    typed graph: in any relation)."""
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
