"""Errors that name what is wrong: the file, the key or value, and what was expected."""


class StoreError(Exception):
    """A store on disk is missing, incomplete, corrupt or of an unknown format."""


class DatasetError(ValueError):
    """Input data given to preprocess is malformed (shape, range, values, files)."""


class PageChecksumError(StoreError, OSError):
    """A page of features.bin does not match features.crc32c: the store is corrupt.

    Raised where the store checks its own pages (Store.verify, reads of the features in
    memory) and, translated from the I/O engine's ChecksumError by gnnssd.pipeline's DirectIO,
    wherever a loader reads pages through the engine: a caller catching StoreError (or OSError,
    as an I/O failure) sees every corrupt page of a store, whichever path read it."""
