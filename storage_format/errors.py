"""Errors that name what is wrong: the file, the key or value, and what was expected."""

import reprlib


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



#: Characters of a value an error message quotes.
SHOWN_CHARS = 200
#: Values, and characters of their strings, past which a value is too large to quote whole:
#: its repr is never built (a hostile file's value may expand to gigabytes of text).
_QUOTABLE_UNITS = 1 << 22
_SCALARS = (type(None), bool, float, complex, bytes, bytearray)


def _quotable(value: object) -> bool:
    """Whether `value`'s whole repr is cheap to build: plain values and containers of them,
    at most _QUOTABLE_UNITS items and string characters in all (walked without recursion:
    a deeply nested value is no RecursionError here)."""
    budget, stack = _QUOTABLE_UNITS, [value]
    while stack:
        item = stack.pop()
        budget -= 1
        if isinstance(item, (str, bytes, bytearray)):
            budget -= len(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            if item.bit_length() > 4096:  # past what Python converts to text
                return False
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif not isinstance(item, _SCALARS):
            return False
        if budget < 0:
            return False
    return True


class _BoundedRepr(reprlib.Repr):
    """reprlib's bounded repr (a few items per container, a few levels deep, long strings
    cut), with integers of more digits than Python converts to text named by their size."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 3, 6, 6, 6, 6
        self.maxstring, self.maxlong, self.maxother = 80, 60, 120

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4096:
            return f"<an integer of {x.bit_length():,} bits>"
        return super().repr_int(x, level)


_BOUNDED_REPR = _BoundedRepr()


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """repr of `value` for an error message, cut to `limit` characters (with the whole
    repr's length); a value too large to quote whole (`_quotable`) is shown in reprlib's
    bounded form, its whole repr never built. The one way an error message quotes a value
    it was given (`{value!r:.100}` builds the whole repr first)."""
    if not _quotable(value):
        text = _BOUNDED_REPR.repr(value)
        return f"{text[:limit]}... (too large to quote whole)"
    try:
        text = repr(value)
    except Exception:  # a value whose own __repr__ fails
        return f"<a {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
