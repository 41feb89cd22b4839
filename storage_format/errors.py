"""Errors that name what is wrong: the file, the key or value, and what was expected."""


class StoreError(Exception):
    """A store on disk is missing, incomplete, corrupt or of an unknown format."""


class DatasetError(ValueError):
    """Input data given to preprocess is malformed (shape, range, values, files)."""


class PageChecksumError(StoreError):
    """A page of features.bin does not match features.crc32c: the store is corrupt.

    Raised where the store itself checks pages (Store.verify, reads of the features in
    memory). Pages read through the I/O engine raise its ChecksumError (an OSError) instead,
    with the same message: the two bottom layers import nothing of each other, so the classes
    share no base (see gnnssd.io_engine.crc.ChecksumError)."""
