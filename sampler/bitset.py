"""A row bitset: one bit per row, bit r % 8 of byte r // 8 (uint8, little-endian within a
byte). The hot rows' membership (plan.HotRows) and a repack window's union of read rows
(readplan.sorted_union) are both held this way: an eighth of a bool array, a 64th of a
row-sized int64 map."""
from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, nogil=True, inline="always")
def has(bits, r):
    """Bit r of `bits`."""
    return (bits[r >> 3] >> (r & 7)) & 1


@nb.njit(cache=True, nogil=True)
def set_rows(bits, rows):
    """Set the bit of each of `rows`; returns how many were not set before."""
    new = 0
    for r in rows:
        mask = np.uint8(1 << (r & 7))
        if not bits[r >> 3] & mask:
            bits[r >> 3] |= mask
            new += 1
    return new


def rows_set(bits, count, out=None):
    """The `count` rows whose bits are set, in order: into `out` (int64, `count` long: a
    mapped file, say) where given, else a new array."""
    out = np.empty(count, np.int64) if out is None else out
    if len(out) != count:
        raise ValueError(f"rows_set: {count} rows set into an array of {len(out)}")
    _rows_into(bits, out)
    return out


@nb.njit(cache=True, nogil=True)
def _rows_into(bits, out):
    k = 0
    for byte in range(bits.shape[0]):
        if bits[byte]:
            for b in range(8):
                if (bits[byte] >> b) & 1:
                    out[k] = byte * 8 + b
                    k += 1
