"""The on-disk store: CSC topology, page-aligned features.bin, labels, splits, node order."""
from .atomic import (OutputWriteError, UnsafeOutputError, appending, atomic_file, atomic_write_bytes,
                     atomic_write_json, check_output_target, writable_file)
from .content import check_indptr_monotone, check_range
from .csc import index_dtype
from .errors import DatasetError, PageChecksumError, StoreError
from .link_split import LinkSplit, parse_fractions, random_negatives
from .manifest import PAGE
from .mapping import mapped_take, release_pages
from .order import Permutation
from .partial_dir import new_output_folder, output_lock
from .paths import contained
from .schema import GraphSchema, NodeType
from .small_files import SmallFileError, read_regular, read_small_json, read_small_text
from .source import DatasetSource, TypedSource, edge_chunks, edge_count, schema_of
from .store import Store
from .writer import FEATURE_DTYPES, write_store

__all__ = ["DatasetError", "DatasetSource", "FEATURE_DTYPES", "GraphSchema", "LinkSplit", "NodeType",
           "OutputWriteError", "PAGE", "PageChecksumError", "Permutation", "SmallFileError", "Store",
           "StoreError", "TypedSource", "UnsafeOutputError", "appending", "atomic_file", "atomic_write_bytes",
           "atomic_write_json", "check_indptr_monotone", "check_output_target", "check_range", "contained",
           "edge_chunks", "edge_count", "index_dtype", "mapped_take", "new_output_folder", "output_lock",
           "parse_fractions", "random_negatives",
           "read_regular", "read_small_json", "read_small_text", "release_pages",
           "schema_of", "writable_file", "write_store"]
