"""The on-disk store: CSC topology, page-aligned features.bin, labels, splits, node order.

Names are imported from their modules on first use (storage_format.lazy): reading a store
loads neither the topology build nor numba."""
from .environment import check_numba_threads
from .lazy import by_name, lazy_exports

check_numba_threads()  # before any module imports numba, which fails on a bad NUMBA_NUM_THREADS unnamed

_EXPORTS = by_name({
    ".atomic": ("OutputWriteError", "UnsafeOutputError", "appending", "atomic_file", "atomic_write_bytes",
                "atomic_write_json", "check_output_target", "disk_of", "writable_file", "write_error"),
    ".content": ("check_indptr_monotone", "check_range"),
    ".preprocess.csc": ("index_dtype",),
    ".environment": ("env_int", "env_seconds", "env_text"),
    ".errors": ("DatasetError", "PageChecksumError", "StoreError", "shown"),
    ".lazy": ("by_name", "lazy_exports"),
    ".link_split": ("LinkSplit", "parse_fractions", "random_negatives"),
    ".manifest": ("FEATURE_DTYPES", "PAGE"),
    ".mapping": ("mapped_take", "release_pages"),
    ".preprocess.order": ("Permutation",),
    ".preprocess.partial_dir": ("new_output_folder", "output_lock"),
    ".paths": ("contained",),
    ".sampling_methods": ("METHODS_EXPECTED", "sampling_method"),
    ".schema": ("ONE_RELATION", "GraphSchema", "NodeType"),
    ".small_files": ("SmallFileError", "opened_regular", "parse_yaml", "read_small_json", "read_small_text",
                     "read_small_yaml"),
    ".preprocess.source": ("DatasetSource", "TypedSource", "edge_chunks", "edge_count"),
    ".store": ("Store",),
    ".preprocess.writer": ("schema_parts", "write_store"),
})
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
