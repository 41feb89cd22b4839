"""Readers for the input formats preprocess accepts, and the synthetic generator."""
from .arrays import ArraySource
from .heterophilous import HeterophilousSource
from .ogb import OGBSource, ogb_source
from .ogb_binary import OGBBinarySource
from .planetoid import PlanetoidSource
from .synthetic import PRESETS, SyntheticSource, SyntheticSpec, synthetic_source

__all__ = ["ArraySource", "HeterophilousSource", "OGBBinarySource", "OGBSource", "PRESETS", "PlanetoidSource",
           "SyntheticSource", "SyntheticSpec", "synthetic_source",
           "ogb_source"]
