"""The store's numba kernels, in one module imported on first use: the window lookups of
`mapping.mapped_take`, the page CRC32C of `page_crc` and the typed-edge check of `content`.
Importing the store's reader (`gnnssd info`, `gnnssd --help`) therefore loads no numba;
the first lookup, page checksum or typed-edge check does."""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def by_window(ids, per, count):
    """The positions of `ids` grouped by window (id // per), in order within each window
    (a counting sort), and where each window's group starts (count + 1 bounds)."""
    bounds = np.zeros(count + 1, np.int64)
    for i in ids:
        bounds[i // per + 1] += 1
    for w in range(count):
        bounds[w + 1] += bounds[w]
    fill = bounds[:-1].copy()
    order = np.empty(ids.shape[0], np.int64)
    for k in range(ids.shape[0]):
        w = ids[k] // per
        order[fill[w]] = k
        fill[w] += 1
    return order, bounds


@numba.njit(cache=True, nogil=True)
def take_window(values, ids, order, lo, hi, out):
    """out[i] = values[ids[i]] for the positions order[lo:hi] (one window's)."""
    for k in range(lo, hi):
        i = order[k]
        out[i] = values[ids[i]]


@numba.njit(cache=True, nogil=True)
def take_range(values, ids, lo, hi, out):
    """out[i] = values[ids[i]] for every i with lo <= ids[i] < hi (one window's IDs, found
    by a pass over all of them: no grouping, see mapping.FEW_WINDOWS)."""
    for i in range(ids.shape[0]):
        v = ids[i]
        if lo <= v < hi:
            out[i] = values[v]


@numba.njit(cache=True)
def crc32c(data, lo, hi, t):
    """CRC32C of data[lo:hi] (int64 arithmetic, so no mixed signed/unsigned types)."""
    crc = np.int64(0xFFFFFFFF)
    i = lo
    while i + 8 <= hi:
        a = crc ^ (np.int64(data[i]) | (np.int64(data[i + 1]) << 8)
                   | (np.int64(data[i + 2]) << 16) | (np.int64(data[i + 3]) << 24))
        crc = (np.int64(t[7, a & 0xFF]) ^ t[6, (a >> 8) & 0xFF] ^ t[5, (a >> 16) & 0xFF]
               ^ t[4, a >> 24] ^ t[3, data[i + 4]] ^ t[2, data[i + 5]] ^ t[1, data[i + 6]]
               ^ t[0, data[i + 7]])
        i += 8
    while i < hi:
        crc = np.int64(t[0, (crc ^ data[i]) & 0xFF]) ^ (crc >> 8)
        i += 1
    return crc ^ 0xFFFFFFFF


@numba.njit(parallel=True, cache=True)
def page_crcs(data, page, t, out):
    n = data.shape[0]
    for k in numba.prange(out.shape[0]):
        lo = k * page
        out[k] = crc32c(data, lo, min(lo + page, n), t)


@numba.njit(cache=True, nogil=True)
def first_mistyped_edge(indptr, indices, etypes, offsets, rel_src, rel_dst, first, last):
    """(edge, why) of the first in-edge of nodes first..last-1 out of its relation's order
    (why 0) or whose source (1) or destination (2) is not of its relation's type; (-1, 0)
    if none."""
    for v in range(first, last):
        for e in range(indptr[v], indptr[v + 1]):
            r = etypes[e]
            if e > indptr[v] and etypes[e - 1] > r:
                return e, 0
            u = indices[e]
            if u < offsets[rel_src[r]] or u >= offsets[rel_src[r] + 1]:
                return e, 1
            if v < offsets[rel_dst[r]] or v >= offsets[rel_dst[r] + 1]:
                return e, 2
    return -1, 0
