"""The on-disk store: CSC topology, page-aligned features.bin, labels, splits, node order."""
from .atomic import atomic_output, atomic_write_bytes, fsync_dir
from .content import check_indptr_monotone, check_range
from .csc import index_dtype
from .errors import DatasetError, PageChecksumError, StoreError
from .link_split import LinkSplit, parse_fractions, random_negatives
from .manifest import PAGE
from .mapping import release_pages, released_chunks
from .order import Permutation
from .schema import GraphSchema, NodeType
from .source import DatasetSource, TypedSource, edge_chunks, edge_count, schema_of
from .store import Store
from .writer import FEATURE_DTYPES, write_store

__all__ = ["DatasetError", "DatasetSource", "FEATURE_DTYPES", "GraphSchema", "LinkSplit", "NodeType", "PAGE",
           "PageChecksumError", "Permutation", "Store", "StoreError", "TypedSource", "atomic_output",
           "atomic_write_bytes", "check_indptr_monotone", "check_range", "edge_chunks", "edge_count", "fsync_dir",
           "index_dtype", "parse_fractions", "random_negatives", "release_pages", "released_chunks", "schema_of",
           "write_store"]
