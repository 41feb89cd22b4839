"""Readers for the input formats preprocess accepts, and the synthetic generator."""
from .arrays import ArraySource
from .heterophilous import HeterophilousSource
from .ogb import OGBSource
from .ogb_link import OGBLinkSource
from .planetoid import PlanetoidSource
from .synthetic import PRESETS, SyntheticSource, SyntheticSpec, synthetic_source

__all__ = ["ArraySource", "HeterophilousSource", "OGBLinkSource", "OGBSource", "PRESETS", "PlanetoidSource",
           "SyntheticSource", "SyntheticSpec", "synthetic_source"]
