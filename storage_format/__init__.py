"""The on-disk store: CSC topology, page-aligned features.bin, labels, splits, node order."""
from .errors import DatasetError, PageChecksumError, StoreError
from .manifest import FORMAT_VERSION
from .order import Permutation, resolve_order
from .source import DatasetSource
from .store import Store
from .writer import FEATURE_DTYPES, write_store

__all__ = ["DatasetError", "DatasetSource", "FEATURE_DTYPES", "FORMAT_VERSION", "Permutation",
           "PageChecksumError", "Store", "StoreError", "resolve_order", "write_store"]
