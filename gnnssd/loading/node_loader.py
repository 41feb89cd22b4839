"""`gnnssd.NodeLoader`: the mini-batches of a user's own training loop, from any backend.

    with gnnssd.NodeLoader(store, store.train_idx, fanouts=[10, 10], batch_size=256,
                           features="ssd", memory_budget="256MiB", shuffle=True) as loader:
        valid = loader.with_seeds(store.valid_idx, fanouts=[-1, -1])   # shares the features
        for epoch in range(5):          # each iteration is the next epoch (set_epoch: pin one)
            for mb in loader:
                loss = F.cross_entropy(model(mb.blocks, mb.x), mb.y)

The data path is two steps, kept apart on purpose: `seed_batches` (gnnssd.sampler) turns
(seeds, batch size, seed order, seed, epoch) into the epoch's list of seed batches, the same
for every mode; the feature backend of a `FeatureSource` (gnnssd.loading.feature_source) turns a
list of seed batches into `MiniBatch`es. A NodeLoader is a cheap iterator over a source:
it opens its own from keyword options, or shares one (`with_seeds`, or a FeatureSource
passed in) with other loaders. Seed orders are policies (gnnssd.sampler.SeedOrder:
sequential, random, proximity, a data-parallel rank's share, or the user's own) plugged in
at that seam; edge mini-batches come through it too (gnnssd.loading.edge_loader).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from gnnssd.core import SamplerConfig, check_count, run_seed
from gnnssd.sampler import Fanouts, SeedOrder, Sequential, Sharded, named_order, seed_batches
from gnnssd.storage_format import GraphSchema, Store, mapped_take

from .feature_source import FeatureSource, SourceLoader
from .form import by_type, typed_form
from .types import MiniBatch


def check_nodes(nodes: Any, num_nodes: int, what: str = "seeds") -> np.ndarray:
    """Node IDs as int64: a boolean mask over all nodes becomes its nonzero IDs; floats,
    other shapes, and IDs outside [0, num_nodes) are refused naming the value."""
    array = nodes.detach().cpu().numpy() if isinstance(nodes, torch.Tensor) else np.asarray(nodes)
    if array.dtype == np.bool_:
        if array.shape != (num_nodes,):
            raise ValueError(f"{what}: a boolean mask of shape {array.shape}; a mask must have one "
                             f"entry per node ({num_nodes})")
        return np.flatnonzero(array).astype(np.int64)
    if array.size == 0:
        return np.empty(0, np.int64)
    if array.ndim != 1:
        raise ValueError(f"{what}: shape {array.shape}; expected a 1-D array of node IDs or a boolean mask "
                         "(or a GraphBolt ItemSet / ItemSetDict of seed_nodes; of (seed, label) pairs as "
                         "an array, pass its node column, e.g. pairs[:, 0])")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{what}: dtype {array.dtype} (e.g. {array[0]!r}); expected integer node IDs "
                         "or a boolean mask")
    bad = array[(array < 0) | (array >= num_nodes)]
    if bad.size:
        raise ValueError(f"{what}: node {bad[0]} outside 0..{num_nodes - 1}")
    return array.astype(np.int64)  # a copy: store arrays are read-only


def graphbolt_items(seeds: Any) -> tuple[Any, Any]:
    """(node IDs, labels or None) of a GraphBolt ItemSet (its seed_nodes, or its only
    item; an int: all nodes below it) or ItemSetDict (IDs as a dict by node type, labels
    one array in their order); any other `seeds` as given, with no labels. An item set of
    something other than nodes (node_pairs, ...) is refused, naming what to pass instead."""
    kind = type(seeds)
    if kind.__name__ not in ("ItemSet", "ItemSetDict") or not kind.__module__.startswith("dgl.graphbolt"):
        return seeds, None
    if kind.__name__ == "ItemSetDict":  # labels in the order of the types' IDs, as one array
        parts = {name: graphbolt_items(items) for name, items in seeds._itemsets.items()}
        labels = [np.asarray(labels).reshape(-1) for _, labels in parts.values() if labels is not None]
        return {name: ids for name, (ids, _) in parts.items()}, np.concatenate(labels) if labels else None
    items, names = seeds._items, seeds.names
    if not isinstance(items, tuple):  # a count: nodes 0..count-1 (GraphBolt's all_nodes_set)
        return np.arange(int(items)), None
    names = names or (("seed_nodes", "labels") if len(items) == 2 else ("seed_nodes",) if len(items) == 1 else ())
    if "seed_nodes" not in names:
        raise ValueError(f"seeds: a GraphBolt ItemSet of {names or f'{len(items)} unnamed items'}; a NodeLoader takes "
                         "an ItemSet of seed_nodes (with labels or not), node IDs or a boolean mask (node pairs: "
                         "gnnssd.EdgeLoader)")
    by_name = dict(zip(names, items))
    return by_name["seed_nodes"], by_name.get("labels")


def check_item_labels(labels: Any, store_ids: np.ndarray, store: Store) -> None:
    """Labels that came with the seeds (a GraphBolt ItemSet's) must be the store's: a
    mini-batch's `y` is read from the store, so a mismatch (another dataset's split, a
    relabelling) is refused naming the first seed that differs."""
    given = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    stored = mapped_take(store.labels, store_ids).astype(np.int64)
    if given.shape != stored.shape:
        raise ValueError(f"seeds: the ItemSet's labels have shape {given.shape} for {len(stored)} seed nodes")
    differ = np.flatnonzero(given.astype(np.int64) != stored)
    if differ.size:
        at = differ[0]
        raise ValueError(f"seeds: the ItemSet labels seed {at} (of {len(stored)}) {given[at]}, the store "
                         f"{store.path} {stored[at]} ({differ.size} differ); a mini-batch's labels come from the "
                         "store: pass the store's own split, or node IDs without labels")


def check_seeds(seeds: Any, schema: GraphSchema) -> np.ndarray:
    """Seeds as node IDs of the store's ID space. On a heterogeneous store: a dict of one
    node type's IDs ({"paper": ids}, as DGL takes them), or the target type's IDs."""
    if not typed_form(schema):
        return check_nodes(seeds, schema.num_nodes)
    given = by_type(seeds, schema.target)
    if len(given) != 1:
        raise ValueError(f"seeds: node types {sorted(given)}; a loader takes the seeds of one "
                         f"node type (the store's are {schema.type_names})")
    (name, seeds), = given.items()
    if name not in schema.type_names:
        raise ValueError(f"seeds: node type {name!r}; expected one of {schema.type_names}")
    t = schema.type_id(name)
    return check_nodes(seeds, schema.node_types[t].count, f"seeds[{name!r}]") + schema.offsets[t]


class NodeLoader(SourceLoader):
    """Mini-batches of `seeds` (the dataset's node IDs, as `store.train_idx` and the other
    splits give them, a boolean mask over the nodes, or a GraphBolt ItemSet / ItemSetDict
    of seed_nodes, whose labels, if any, must be the store's) for node-level
    tasks, features from `source`: a FeatureSource shared with other loaders, or a Store or
    its path, for which the loader opens its own source from `source_options` (`features`:
    memory, ssd, mmap, per-row, device: the whole store on `device`, see
    gnnssd.loading.backends.device; `method`: uniform or labor neighbour sampling (see
    SamplerConfig.method; GraphBolt's and DGL's names too: "sample_layer_neighbor",
    "LaborSampler", ...); SSDConfig's fields such as `memory_budget`; `seed`,
    `device`, `scratch_dir`, `eval_fanouts`/`eval_batch_size` that size the ssd buffers for
    evaluation loaders) and closes it with itself. Defaults follow the config.

    `with_seeds` makes an evaluation loader over the same source (its hot cache and
    buffers). Loaders of one source may be iterated in any interleaving: evaluating in the
    middle of a training epoch gives every mini-batch its stored rows (see
    SSDLoader.minibatches).

    With `shuffle`, each epoch's seeds come in the order `seed_order` names: "random" (a
    uniform shuffle) or "proximity" (runs of `seed_window` nearby store IDs,
    `gnnssd.sampler.Proximity`); without, in the order given. A `gnnssd.sampler.SeedOrder`
    object is used as given (the user's own policy). `seed` (default: drawn from torch's
    global generator, so `torch.manual_seed` governs it) seeds the shuffles and, for a
    loader that opens its own source, the neighbour draws.

    Each iteration is the next epoch, as with DGL's DataLoader (a fresh order and fresh
    neighbour draws); `set_epoch(e)` makes the next iteration epoch e: data-parallel ranks
    agree on it, and the same e replays the same mini-batches.

    `reuse_epochs=K` trains K consecutive epochs on the same samples (seed order and
    neighbour draws of the group's first epoch; groups start at `first_epoch`, the number
    of the loop's first epoch); in ssd mode the group's other epochs replay its plans and
    compact blocks from disk instead of sampling and repacking again.

    Data parallel: rank `rank` of `world_size` (default: this process's place in the
    initialised torch.distributed process group, else 0 of 1) iterates over its `shard` of
    each epoch's seed order, the same order on every rank; all ranks get the same number of
    mini-batches. `with_seeds` loaders are not sharded.
    """

    def __init__(self, source: FeatureSource | Store | str | Path, seeds: Any, *,
                 fanouts: Fanouts | list[int] | list[dict[str, int]],
                 batch_size: int, shuffle: bool = False, seed: int | None = None, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 seed_order: str | SeedOrder = SamplerConfig.seed_order,
                 seed_window: int = SamplerConfig.seed_window,
                 reuse_epochs: int = SamplerConfig.reuse_epochs, first_epoch: int = 0, **source_options: Any):
        fanouts = Fanouts.parse(fanouts)
        if not isinstance(seed_order, SeedOrder):
            named = named_order(seed_order, seed_window)  # a bad name is refused, shuffled or not
            seed_order = named if shuffle else Sequential()
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size: {batch_size!r}; expected a positive integer")
        reuse_epochs, first_epoch = check_count(reuse_epochs, "reuse_epochs", 1), check_count(first_epoch, "first_epoch")
        self.rank, self.world_size = _ranks(rank, world_size)
        self._owns_source = not isinstance(source, FeatureSource)
        if self._owns_source:
            source = FeatureSource.from_options(source, fanouts=fanouts, batch_size=batch_size,
                                                seed=seed, **source_options)
        elif source_options:
            raise TypeError(f"{', '.join(sorted(source_options))}: options of the FeatureSource, which "
                            "is already open; pass them to it, or pass a Store to open one here")
        super().__init__(source, self._owns_source)
        try:
            fanouts.array(source.store.schema)  # a relation misspelt: refused now, not when iterated
            seeds, labels = graphbolt_items(seeds)
            self.seeds = check_seeds(seeds, source.store.schema)
            self.store_ids = source.store_ids(self.seeds)  # what the seed order and backend take
            if labels is not None:
                check_item_labels(labels, self.store_ids, source.store)
        except BaseException:
            self.close()
            raise
        self.fanouts, self.batch_size = fanouts, int(batch_size)
        self.drop_last = drop_last
        # the shuffle's seed; the source's seeds the neighbour draws
        self.seed = source.seed if seed is None or self._owns_source else run_seed(seed)
        self.order = seed_order if self.world_size == 1 else Sharded(seed_order, self.rank, self.world_size)
        self.reuse_epochs, self.first_epoch = reuse_epochs, first_epoch

    def with_seeds(self, seeds: Any, *, fanouts: Fanouts | list[int] | list[dict[str, int]] | None = None,
                   batch_size: int | None = None, shuffle: bool = False, drop_last: bool = False) -> NodeLoader:
        """A loader over other seeds (e.g. a validation split) sharing this one's source
        (features, hot cache and buffers); closing it releases nothing, closing this one
        releases the source it opened."""
        return NodeLoader(self.source, seeds, fanouts=fanouts or self.fanouts,
                          batch_size=batch_size or self.batch_size, shuffle=shuffle, seed=self.seed,
                          drop_last=drop_last, rank=0, world_size=1)

    @property
    def features(self) -> str:
        """The backend's name (memory, ssd, mmap, per-row)."""
        return self.source.features

    @property
    def sample_epoch(self) -> int:
        """The epoch whose samples this one trains on: the first of its group of
        `reuse_epochs` epochs, groups counted from `first_epoch` (an epoch before that is
        its own)."""
        if self.epoch < self.first_epoch:
            return self.epoch
        return self.epoch - (self.epoch - self.first_epoch) % self.reuse_epochs

    def seed_batches(self) -> list[np.ndarray]:
        """This epoch's seed batches (this rank's share; store IDs), in order (the same in
        every mode)."""
        return seed_batches(self.store_ids, self.batch_size, self.order, self.seed, self.sample_epoch, self.drop_last)

    def __iter__(self) -> Iterator[MiniBatch]:
        """The next epoch's mini-batches (its order drawn now: iterators may interleave)."""
        self._start_epoch()
        return self._converted(self.backend.minibatches(self.seed_batches(), self.fanouts, self.sample_epoch,
                                                        reuse_epochs=self.reuse_epochs))

    def _converted(self, batches: Iterator[MiniBatch]) -> Iterator[MiniBatch]:
        try:  # closed here, not when collected: a caller's break stops the I/O threads now
            with self.source.iteration():
                for batch in batches:
                    yield self.source.with_original_ids(batch)
                    del batch  # not held while the next one is made (its x would stay alive)
                    self._check_still_open()
                self._check_still_open()
        finally:
            batches.close()

    def __len__(self) -> int:
        full, rest = divmod(-(-len(self.seeds) // self.world_size), self.batch_size)
        return full + (0 if self.drop_last or rest == 0 else 1)

def _ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size) as given, or this process's in the initialised process group."""
    from gnnssd.core import current

    ranks = current()
    rank = ranks.rank if rank is None else rank
    world_size = ranks.world_size if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank}, world_size {world_size}: expected 0 <= rank < world_size")
    return rank, world_size
