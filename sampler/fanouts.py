"""How many in-neighbours each layer samples, per relation: one value, parsed once.

Fanouts are written as a list with an entry per layer (the input layer first, as DGL's
samplers take them): a number for every relation (-1: all neighbours), or on a
heterogeneous store a dict of numbers by relation name (a relation left out, or 0: none of
it). `Fanouts.parse` checks them where they come in (the config's `sampler.fanouts` and
`sampler.eval_fanouts`, the loaders' `fanouts=`) and keeps them as given; for a store's
schema, `array` is the per-layer, per-relation int64 array gnnssd's sampler takes and
`dgl` DGL's form (ints, or per-layer dicts by canonical relation). A homogeneous store is
the one-relation case: its array has one column.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from gnnssd.storage_format import GraphSchema, shown

#: The largest count an argument or key may give (epochs, fanouts, ...): what a C int
#: holds, as DGL's and numba's kernels take them.
MAX_COUNT = 2**31 - 1

#: What a fanouts value must be, as every error about one says.
FANOUTS_EXPECTED = (f"a non-empty list of positive integers (one per layer; -1 = all neighbours) up to {MAX_COUNT:,}, "
            "or per layer a dict of them by relation name")

#: One layer: a fanout for every relation, or (relation name, fanout) pairs as the dict gave them.
Layer = int | tuple[tuple[str, int], ...]


def is_fanout(value: Any, low: int = 1) -> bool:
    """A fanout: -1 (all neighbours) or an integer (Python's or NumPy's, not a bool) from
    `low` (0 inside a relation dict: none of that relation) to MAX_COUNT."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
            and (value == -1 or low <= value <= MAX_COUNT))


def _layer(value: Any) -> Layer | None:
    """One layer's fanout as Fanouts holds it, or None when it is not one."""
    if isinstance(value, dict):
        if value and all(isinstance(k, str) and is_fanout(v, 0) for k, v in value.items()):
            return tuple((k, int(v)) for k, v in value.items())
        return None
    return int(value) if is_fanout(value) else None


@dataclass(frozen=True, eq=False)
class Fanouts:
    """Per layer (input layer first), a fanout for every relation or a dict of them by
    relation name; equal to the list it was written as (`[10, 10] == Fanouts.parse([10, 10])`)."""

    layers: tuple[Layer, ...]

    @classmethod
    def parse(cls, value: Any, key: str = "fanouts") -> Fanouts:
        """`value` (a list or tuple of layers; a Fanouts as it is) checked, or a ValueError
        naming `key`, the value and what is expected (10**30 once overflowed in the sampler, unnamed)."""
        if isinstance(value, Fanouts):
            return value
        layers = [_layer(f) for f in value] if isinstance(value, (list, tuple)) else []
        if not layers or any(layer is None for layer in layers):
            raise ValueError(f"{key}: {shown(value)}; expected {FANOUTS_EXPECTED}")
        return cls(tuple(layers))

    @classmethod
    def all_neighbours(cls, layers: int) -> Fanouts:
        return cls((-1,) * layers)

    def to_list(self) -> list[int | dict[str, int]]:
        """As a config file or a loader's `fanouts=` writes them."""
        return [dict(layer) if isinstance(layer, tuple) else layer for layer in self.layers]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[int | dict[str, int]]:
        return iter(self.to_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Fanouts):
            return self.to_list() == other.to_list()
        if isinstance(other, (list, tuple)):
            return self.to_list() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(tuple(sorted(layer)) if isinstance(layer, tuple) else layer for layer in self.layers))

    def __str__(self) -> str:
        return str(self.to_list())

    def __repr__(self) -> str:
        return f"Fanouts({self.to_list()})"

    def array(self, schema: GraphSchema) -> np.ndarray:
        """int64 (layers, relations) in the order of the schema's relations: the sampler's
        form. A relation dict naming a relation the store lacks, or given on a homogeneous
        store, is refused (when the loader is built, not when it is iterated)."""
        names = [name for _, name, _ in schema.relations]
        given = [dict(layer) for layer in self.layers if isinstance(layer, tuple)]
        if given and schema.is_homogeneous:
            raise ValueError(f"fanouts {self}: per-relation fanouts need a heterogeneous store; "
                             "this one has one node type and one relation")
        unknown = sorted({name for layer in given for name in layer} - set(names))
        if unknown:
            raise ValueError(f"fanouts name relations {unknown}; the graph's relations are {names}")
        return relation_array([[dict(layer).get(name, 0) for name in names] if isinstance(layer, tuple) else layer
                               for layer in self.layers], len(names))

    def dgl(self, schema: GraphSchema) -> list[int] | list[dict[tuple[str, str, str], int]]:
        """DGL's form (dgl.dataloading.NeighborSampler's `fanouts`): a list of ints on a
        homogeneous store, else per layer a dict by canonical relation."""
        array = self.array(schema)
        if schema.is_homogeneous:
            return array[:, 0].tolist()
        return [dict(zip(schema.relations, row)) for row in array.tolist()]


def relation_array(layers: Sequence[Any], num_relations: int) -> np.ndarray:
    """int64 (layers, num_relations) from per layer one number (every relation) or one
    per relation: the form NeighborSampler normalises its `fanouts` to (an array of that
    shape passes as it is). A count below -1 is refused."""
    array = np.empty((len(layers), num_relations), np.int64)
    for i, layer in enumerate(layers):
        given = np.asarray(layer, np.int64)
        if given.ndim > 1 or given.size not in (1, num_relations):
            raise ValueError(f"fanouts {shown([np.asarray(f).tolist() for f in layers])}: layer {i} has "
                             f"{given.size} fanouts; expected one, or one per relation ({num_relations})")
        array[i] = given.reshape(-1)
    if (array < -1).any():
        raise ValueError(f"fanouts {[np.asarray(f).tolist() for f in layers]}: expected -1 (all neighbours) "
                         "or a count >= 0 per layer")
    return array
