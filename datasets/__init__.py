"""Readers for the input formats preprocess accepts, and the synthetic generator."""
from .arrays import ArraySource
from .flatten import FlattenedSource
from .graphbolt import GraphBoltSource
from .graphbolt_hetero import GraphBoltHeteroSource
from .hetero_synthetic import HeteroSpec, HeteroSyntheticSource, hetero_synthetic_source
from .heterophilous import HeterophilousSource
from .igb import IGBSource
from .mag240m import MAG240MSource
from .ogb import OGBSource, ogb_source
from .ogb_binary import OGBBinarySource
from .ogb_hetero import OGBHeteroSource
from .ogb_link import OGBLinkSource
from .planetoid import PlanetoidSource
from .synthetic import PRESETS, SyntheticSource, SyntheticSpec, synthetic_source

__all__ = ["ArraySource", "FlattenedSource", "GraphBoltHeteroSource", "GraphBoltSource", "HeteroSpec", "HeteroSyntheticSource", "HeterophilousSource",
           "IGBSource", "MAG240MSource", "OGBBinarySource", "OGBHeteroSource", "OGBLinkSource", "OGBSource",
           "PRESETS", "PlanetoidSource", "SyntheticSource", "SyntheticSpec", "hetero_synthetic_source",
           "ogb_source", "synthetic_source"]
