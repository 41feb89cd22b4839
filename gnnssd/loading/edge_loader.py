"""Edge mini-batches for link prediction: positives, seeded negatives, and the blocks and
features of all their endpoints, with the batch's own edges excluded from sampling.

`EdgeLoader` has the shape of `gnnssd.NodeLoader` (keyword options, context manager,
`set_epoch`, `len`, `io_stats`, `stage_times`, `close`) and iterates over a FeatureSource
as NodeLoader does: the seed order here is edge batches (`edge_groups`: each batch's
endpoints and negatives), and the source's backend turns them into mini-batches through
the same protocol as node batches, `backend.minibatches(seeds, fanouts, epoch,
exclude=pairs)`: every mode through gnnssd's numba sampler (ssd mode through the mega-batch
planner), so edge mini-batches are planned ahead and read out of core like node
mini-batches.

On a heterogeneous store the edges are of one relation (`edges={"cites": (src, dst)}`,
IDs within the relation's source and destination types, as `store.link_edges` gives
them): negatives are drawn from the destination type, the seeds are typed, the blocks
heterogeneous (a batch's pairs excluded in every relation, both directions, so a reverse
relation's twin edge is excluded too) and `pos`/`neg` index `output_nodes` of the
relation's source type (column 0) and destination type (column 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from gnnssd.core import check_count
from gnnssd.sampler import Fanouts, Sequential, Sharded
from gnnssd.storage_format import GraphSchema, Store, random_negatives

from .feature_source import BACKENDS, FeatureSource, SourceLoader
from .form import by_type, typed_form
from .node_loader import NodeLoader, _ranks
from .types import MiniBatch

#: The backends that serve edge mini-batches (their EDGE_BATCHES flag).
EDGE_FEATURES = tuple(name for name, backend in BACKENDS.items() if backend.EDGE_BATCHES)


@dataclass
class EdgeBatch(MiniBatch):
    """One edge mini-batch: a MiniBatch of all the endpoints (and negatives) with `pos`
    (B, 2) and `neg` (B * k, 2), index pairs into `output_nodes` (on a heterogeneous
    store into output_nodes[relation[0]] and output_nodes[relation[2]])."""

    pos: torch.Tensor
    neg: torch.Tensor
    #: The edges' relation (source type, name, destination type); None on a homogeneous store.
    relation: tuple[str, str, str] | None = None


@dataclass
class EdgeGroup:
    """What is fixed before sampling: the endpoints (sorted, unique) and the pairs."""

    seeds: np.ndarray
    pos_edges: np.ndarray  # (B, 2) store IDs (what sampling excludes)
    pos: np.ndarray  # (B, 2) into seeds
    neg: np.ndarray  # (B * k, 2) into seeds


def as_edge_array(edges: Any) -> np.ndarray:
    """(src, dst) or an (E, 2) array -> (E, 2) int64."""
    if isinstance(edges, tuple) and len(edges) == 2:
        src, dst = (np.asarray(e, np.int64) for e in edges)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError(f"edges: source and destination arrays have shapes {src.shape} and "
                             f"{dst.shape}, expected two equal 1-D arrays")
        return np.stack([src, dst], axis=1)
    array = np.asarray(edges, np.int64)
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"edges: shape {array.shape}, expected (src, dst) or (E, 2)")
    return array


def edge_groups(edges: np.ndarray, batch_size: int, negatives: int, dst_nodes: tuple[int, int],
                seed: int, epoch: int, shuffle: bool, ends_first: tuple[int, int] = (0, 0)) -> list[EdgeGroup]:
    """The epoch's edge mini-batches: positives (permuted with (seed, epoch) when
    shuffling), `negatives` corrupted destinations each (never the positive's own), drawn
    from the nodes dst_nodes = (first, count). pos and neg index the seeds from
    ends_first, the first ID of the source's and of the destination's type (a typed
    store's output_nodes are per type)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(edges)) if shuffle else np.arange(len(edges))
    groups = []
    for lo in range(0, len(edges), batch_size):
        pos_edges = edges[order[lo:lo + batch_size]]
        neg_dst = random_negatives(pos_edges[:, 1], negatives, dst_nodes[1], rng, dst_nodes[0]).ravel()
        neg_src = np.repeat(pos_edges[:, 0], negatives)
        seeds = np.unique(np.concatenate([pos_edges.ravel(), neg_dst]))
        first = np.searchsorted(seeds, ends_first)
        groups.append(EdgeGroup(seeds, pos_edges, np.searchsorted(seeds, pos_edges) - first,
                                np.searchsorted(seeds, np.stack([neg_src, neg_dst], axis=1)) - first))
    return groups


def relation_edges(edges: Any, schema: GraphSchema) -> tuple[tuple[str, str, str] | None, np.ndarray]:
    """(relation, (E, 2) edges in the store's global IDs) of a loader's `edges`: on a
    heterogeneous store a dict of one relation's edges within its end types."""
    if not typed_form(schema):
        array = as_edge_array(edges)
        bad = array[(array < 0) | (array >= schema.num_nodes)]
        if bad.size:
            raise ValueError(f"edges: node {bad[0]} outside 0..{schema.num_nodes - 1}")
        return None, array
    names = [r for _, r, _ in schema.relations]
    given = by_type(edges, None)  # not a dict: no relation named (key None)
    if len(given) != 1 or None in given:
        raise ValueError(f"edges: a heterogeneous store takes one relation's edges as a dict, e.g. "
                         f"{{{names[0]!r}: (src, dst)}}; its relations are {names}")
    (name, pairs), = given.items()
    if name not in names:
        raise ValueError(f"edges: relation {name!r}; expected one of {names}")
    relation = schema.relations[names.index(name)]
    array = as_edge_array(pairs).copy()  # made global below: never the caller's array
    for col, node_type in ((0, relation[0]), (1, relation[2])):
        t = schema.type_id(node_type)
        count = schema.node_types[t].count
        bad = array[:, col][(array[:, col] < 0) | (array[:, col] >= count)]
        if bad.size:
            raise ValueError(f"edges[{name!r}]: {node_type!r} node {bad[0]} outside 0..{count - 1}")
        array[:, col] += schema.offsets[t]
    return relation, array


class EdgeLoader(SourceLoader):
    """Edge mini-batches of `edges` (the dataset's node IDs, as `store.link_edges` gives
    them; (src, dst) or (E, 2); on a heterogeneous store a dict of one relation's, e.g.
    {"cites": (src, dst)}) with `negatives` negatives per positive, features from
    `source` (a FeatureSource, or a Store or its path for which it opens its own from
    `source_options`, NodeLoader's: memory_budget, device, eval_fanouts, scratch_dir, ...;
    features memory or ssd).

    Each batch's positive edges and their reverses are excluded from its sampled blocks
    (DGL's exclude="reverse_id"), so no batch sees the edges it is asked to predict.
    `drop_last` drops a last batch of fewer than `batch_size` edges. Epochs and `seed` as
    NodeLoader's: each iteration is the next epoch unless `set_epoch` names one.

    Data parallel: rank `rank` of `world_size` (default: this process's place in the
    initialised torch.distributed process group, else 0 of 1) iterates over its `shard` of
    the one-process epoch's batches (the same positives and negatives, every world_size-th
    batch, wrapped so that all ranks get the same number).
    """

    def __init__(self, source: FeatureSource | Store | str | Path, edges: Any, *,
                 fanouts: Fanouts | list[int] | list[dict[str, int]], batch_size: int, negatives: int = 1,
                 shuffle: bool = True, seed: int | None = None, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None, **source_options: Any):
        fanouts = Fanouts.parse(fanouts)
        batch_size, negatives = check_count(batch_size, "batch_size", 1), check_count(negatives, "negatives", 1)
        self.rank, self.world_size = _ranks(rank, world_size)
        self._shard = Sequential() if self.world_size == 1 else Sharded(Sequential(), self.rank, self.world_size)
        features = source.features if isinstance(source, FeatureSource) else source_options.get("features", "memory")
        if features not in EDGE_FEATURES:
            raise ValueError(f"features: {features!r}; expected one of {EDGE_FEATURES}")
        self._owns_source = not isinstance(source, FeatureSource)
        if self._owns_source:
            # A batch's seeds: its endpoints and negative destinations (what the buffers must hold).
            store = source if isinstance(source, Store) else Store.open(source)
            seeds_per_batch = min(store.num_nodes, batch_size * (2 + negatives))
            source = FeatureSource.from_options(store, fanouts=fanouts, batch_size=seeds_per_batch, seed=seed,
                                                **source_options)
        super().__init__(source, self._owns_source)
        try:
            fanouts.array(self.store.schema)  # a relation misspelt: refused now, not when iterated
            self.relation, self.edges = relation_edges(edges, self.store.schema)
        except BaseException:
            self.close()
            raise
        self.store_edges = source.store_ids(self.edges)  # what sampling and exclusion take
        schema = self.store.schema
        src_type, _, dst_type = self.relation or (schema.target, None, schema.target)  # homogeneous: one type
        self._ends_first = tuple(int(schema.offsets[schema.type_id(t)]) for t in (src_type, dst_type))
        self._dst_nodes = (self._ends_first[1], schema.node_types[schema.type_id(dst_type)].count)
        self.batch_size, self.negatives, self.shuffle, self.drop_last = batch_size, negatives, shuffle, drop_last
        self.fanouts, self.seed = fanouts, source.seed

    def _epoch_batches(self) -> int:
        """The batches of one process's epoch (all ranks' together)."""
        full, rest = divmod(len(self.edges), self.batch_size)
        return full + (0 if self.drop_last or rest == 0 else 1)

    def __len__(self) -> int:
        return -(-self._epoch_batches() // self.world_size)

    def __iter__(self) -> Iterator[EdgeBatch]:
        """The next epoch's edge mini-batches (drawn now: iterators may interleave)."""
        self._start_epoch()
        groups = edge_groups(self.store_edges, self.batch_size, self.negatives, self._dst_nodes,
                             self.seed, self.epoch, self.shuffle, self._ends_first)[:self._epoch_batches()]
        groups = [groups[k] for k in self._shard.order(np.arange(len(groups)), self.seed, self.epoch)]
        return self._edge_batches(groups, self.backend.minibatches([g.seeds for g in groups], self.fanouts,
                                                                   self.epoch, exclude=[g.pos_edges for g in groups]))

    def _edge_batches(self, groups: list[EdgeGroup], batches: Iterator[MiniBatch]) -> Iterator[EdgeBatch]:
        try:  # closed here, not when collected: a caller's break stops the I/O threads now
            with self.source.iteration():
                for group, batch in zip(groups, batches):
                    batch = self.source.with_original_ids(batch)
                    yield EdgeBatch(batch.input_nodes, batch.output_nodes, batch.blocks, batch.x, batch.y,
                                    torch.from_numpy(group.pos), torch.from_numpy(group.neg), self.relation,
                                    typed=batch.typed)
                    del batch  # not held while the next one is made (its x would stay alive)
                    self._check_still_open()
                self._check_still_open()
        finally:
            batches.close()

    def node_batches(self, nodes: Any, fanouts: Fanouts | list[int] | list[dict[str, int]],
                     batch_size: int) -> Iterator[MiniBatch]:
        """Node mini-batches of `nodes` (NodeLoader's seeds: on a heterogeneous store a
        dict of one type's IDs) in order through the same source (evaluation embeddings)."""
        view = NodeLoader(self.source, nodes, fanouts=fanouts, batch_size=batch_size, rank=0, world_size=1)
        view.set_epoch(self.epoch)
        return iter(view)
