"""gnnssd.io_engine: batched O_DIRECT reads through io_uring (C, via cffi), with a C
thread-pool fallback, and fixed-stride row readers built on them."""
from .crc import ChecksumError
from .engine import ALIGNMENT, Engine, Handle
from .rows import copy_rows, gather_rows

__all__ = ["ALIGNMENT", "ChecksumError", "Engine", "Handle", "copy_rows", "gather_rows"]
