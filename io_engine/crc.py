"""CRC32C in C (SSE4.2 where the CPU has it): the page checksums of features.bin."""
from __future__ import annotations

import errno
from typing import Any

import numpy as np

from ._gnnssd_io import ffi, lib

PAGE = lib.GIO_CRC_PAGE  # one CRC32C per PAGE bytes of a checked file (defined in gio.h)


class ChecksumError(OSError):
    """A page read from a file did not match its checksum: the file is corrupt.

    The engine's own error (this layer imports no other). Reads of a store's files go
    through gnnssd.pipeline.DirectIO, which raises the store's PageChecksumError (a
    StoreError and an OSError) in its place, with the same message."""


def checksum_error(path: str, page: int, got: int, expected: int) -> ChecksumError:
    """The error for page `page` of `path` whose CRC32C is `got`, not `expected`: the
    wording of the store's page_checksum_error (storage_format/page_crc.py), which this
    layer cannot call; tests/faults/test_store.py holds the two to one message."""
    return ChecksumError(
        errno.EBADMSG,
        f"{path}: page {page} (bytes {page * PAGE}..{(page + 1) * PAGE - 1}) has CRC32C "
        f"{got:#010x}, its checksum file says {expected:#010x}: the file is corrupt; run "
        "`gnnssd verify STORE` and rerun `gnnssd preprocess`",
        path,
    )


def crc32c(data: Any, crc: int = 0, hardware: bool = True) -> int:
    """CRC32C of a bytes-like object, continuing from `crc`; hardware=False uses the
    table code even where the CPU instruction exists (to compare the two)."""
    view = memoryview(data).cast("B")
    return int(lib.gio_crc32c(crc, ffi.from_buffer("uint8_t[]", view), view.nbytes, int(hardware)))


def hardware_crc32c() -> bool:
    """Whether crc32c runs on the CPU's crc32 instruction."""
    return bool(lib.gio_crc32c_hardware())


def page_crc32c(data: Any, page: int = PAGE) -> np.ndarray:
    """The CRC32C of every `page` bytes of data (the last page may be shorter), uint32."""
    view = memoryview(data).cast("B")
    out = np.empty(-(-view.nbytes // page), dtype=np.uint32)
    if out.size:
        lib.gio_page_crcs(ffi.from_buffer("uint8_t[]", view), view.nbytes, page,
                          ffi.from_buffer("uint32_t[]", out))
    return out


def first_bad_page(data: Any, offset: int, checksums: np.ndarray) -> tuple[int, int] | None:
    """(page, its CRC32C) of the first page of data (read at file `offset`, a multiple of
    PAGE) that does not match checksums, or None when all match."""
    view = memoryview(data).cast("B")
    page, got = ffi.new("int64_t *"), ffi.new("uint32_t *")
    if view.nbytes and lib.gio_verify_pages(ffi.from_buffer("uint8_t[]", view), offset,
                                             view.nbytes, ffi.from_buffer("uint32_t[]", checksums),
                                             len(checksums), page, got):
        return int(page[0]), int(got[0])
    return None
