"""The on-disk store: CSC topology, page-aligned features.bin, labels, splits, node order."""
from .environment import check_numba_threads, env_int, env_seconds, env_text

check_numba_threads()  # before .content imports numba, which fails on a bad NUMBA_NUM_THREADS unnamed

from .atomic import (OutputWriteError, UnsafeOutputError, appending, atomic_file, atomic_write_bytes,
                     atomic_write_json, check_output_target)
from .content import check_indptr_monotone, check_range
from .csc import index_dtype
from .errors import DatasetError, PageChecksumError, StoreError, shown
from .link_split import LinkSplit, parse_fractions, random_negatives
from .manifest import PAGE
from .mapping import mapped_take, release_pages
from .order import Permutation
from .paths import contained
from .schema import GraphSchema, NodeType
from .small_files import (SmallFileError, opened_regular, parse_yaml, read_small_json, read_small_text,
                          read_small_yaml)
from .source import DatasetSource, TypedSource, edge_chunks, edge_count, schema_of
from .store import Store
from .writer import FEATURE_DTYPES, write_store

__all__ = ["DatasetError", "DatasetSource", "FEATURE_DTYPES", "GraphSchema", "LinkSplit", "NodeType",
           "OutputWriteError", "PAGE", "PageChecksumError", "Permutation", "SmallFileError", "Store",
           "StoreError", "TypedSource", "UnsafeOutputError", "appending", "atomic_file", "atomic_write_bytes",
           "atomic_write_json", "check_indptr_monotone", "check_output_target", "check_range", "contained",
           "edge_chunks", "edge_count", "env_int", "env_seconds", "env_text", "index_dtype", "mapped_take", "opened_regular", "parse_fractions", "parse_yaml",
           "random_negatives", "read_small_json", "read_small_text", "read_small_yaml",
           "release_pages", "schema_of", "shown", "write_store"]
