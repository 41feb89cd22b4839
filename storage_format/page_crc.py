"""CRC32C (Castagnoli) of features.bin's pages, in numba (storage_format.kernels): the
store computes and checks its own page checksums, without the I/O engine's C code (the
store imports nothing of gnnssd).

Slice-by-8 tables (eight bytes per step), pages in parallel; the same checksums as the
engine's C CRC32C, which verifies the pages it reads against features.crc32c."""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import PageChecksumError
from .manifest import PAGE

POLY = 0x82F63B78  # CRC32C, reflected


def _slice_by_8_tables() -> np.ndarray:
    """tables[k][b]: the CRC of byte b followed by k zero bytes (uint32, 8 x 256)."""
    crc = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        crc = (crc >> np.uint32(1)) ^ (np.uint32(POLY) * (crc & np.uint32(1)))
    tables = np.empty((8, 256), dtype=np.uint32)
    tables[0] = crc
    for k in range(1, 8):
        tables[k] = (tables[k - 1] >> np.uint32(8)) ^ tables[0][tables[k - 1] & np.uint32(0xFF)]
    return tables


TABLES = _slice_by_8_tables()


def _as_bytes(data: Any) -> np.ndarray:
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def page_crc32c(data: Any, page: int = PAGE) -> np.ndarray:
    """The CRC32C of every `page` bytes of a bytes-like object (the last page may be
    shorter), uint32."""
    if page <= 0:
        raise ValueError(f"page size {page}: expected a positive number of bytes")
    view = _as_bytes(data)
    out = np.empty(-(-view.size // page), dtype=np.uint32)
    if out.size:
        from . import kernels  # numba, loaded on the first page checksum

        kernels.page_crcs(view, page, TABLES, out)
    return out


def first_bad_page(data: Any, offset: int, checksums: np.ndarray) -> tuple[int, int] | None:
    """(page, its CRC32C) of the first page of data (read at file `offset`, a multiple of
    PAGE) that does not match checksums, or None when all match. Pages past the end of
    checksums are not checked (the store checks the checksum file's size at open)."""
    if offset % PAGE:
        raise ValueError(f"offset {offset}: expected a multiple of the {PAGE}-byte page")
    view, first = _as_bytes(data), offset // PAGE
    pages = max(min(-(-view.size // PAGE), len(checksums) - first), 0)
    sums = page_crc32c(view[:pages * PAGE])
    bad = np.flatnonzero(sums != checksums[first:first + pages])
    return (first + int(bad[0]), int(sums[bad[0]])) if bad.size else None


def page_checksum_error(path: str, page: int, got: int, expected: int) -> PageChecksumError:
    """The error for page `page` of `path` whose CRC32C is `got`, not `expected`; the I/O
    engine's checksum_error (io_engine/crc.py) words a page it reads the same, as
    tests/faults/test_store.py checks (neither layer may import the other)."""
    return PageChecksumError(
        f"{path}: page {page} (bytes {page * PAGE}..{(page + 1) * PAGE - 1}) has CRC32C "
        f"{got:#010x}, its checksum file says {expected:#010x}: the file is corrupt; run "
        "`gnnssd verify STORE` and rerun `gnnssd preprocess`")
