"""The names of the neighbour-sampling methods, and the one parser of them.

The configuration (gnnssd.core's `sampler.method`) and the sampler (gnnssd.sampler's
NeighborSampler, the loaders' `method=`) both read a method's name; the store's layer is
the one both may import (tests/test_layering.py), and this module imports nothing, so a
config is checked without loading numba.
"""
from __future__ import annotations

#: NeighborSampler's `method`s: uniform neighbour sampling, layer-neighbour sampling (LABOR).
SAMPLING_METHODS = ("uniform", "labor")
#: Other names of the methods (any case; '-' as '_'): GraphBolt's datapipe methods and DGL's
#: sampler classes, as a user of either writes them.
METHOD_ALIASES = {"neighbor": "uniform", "neighbour": "uniform", "sample_neighbor": "uniform",
                  "neighborsampler": "uniform", "layer_neighbor": "labor", "layer_neighbour": "labor",
                  "sample_layer_neighbor": "labor", "laborsampler": "labor"}
_ALIASES_NOTE = f"(or GraphBolt's and DGL's names: {', '.join(sorted(METHOD_ALIASES))}; any case)"
#: What a config's `sampler.method` may be, as its error message says it.
METHODS_EXPECTED = f"one of {list(SAMPLING_METHODS)} {_ALIASES_NOTE}"


def sampling_method(name: object) -> str:
    """The method `name` means, "uniform" or "labor": one of SAMPLING_METHODS or its
    GraphBolt or DGL name ("sample_layer_neighbor", "LaborSampler", "neighbor", ...), in any
    case; a ValueError naming the choices otherwise."""
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else None
    if key in SAMPLING_METHODS or key in METHOD_ALIASES:
        return METHOD_ALIASES.get(key, key)
    raise ValueError(f"method: {name!r}; expected one of {SAMPLING_METHODS} {_ALIASES_NOTE}")
