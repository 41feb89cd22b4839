"""Readers for the input formats preprocess accepts, and the synthetic generator."""
from .arrays import ArraySource
from .graphbolt import GraphBoltSource
from .heterophilous import HeterophilousSource
from .igb import IGBSource
from .ogb import OGBSource, ogb_source
from .ogb_binary import OGBBinarySource
from .planetoid import PlanetoidSource
from .synthetic import PRESETS, SyntheticSource, SyntheticSpec, synthetic_source

__all__ = ["ArraySource", "GraphBoltSource", "HeterophilousSource", "IGBSource", "OGBBinarySource",
           "OGBSource", "PRESETS", "PlanetoidSource", "SyntheticSource", "SyntheticSpec",
           "ogb_source", "synthetic_source"]
