"""CRC32C in C (AVX-512 VPCLMULQDQ or SSE4.2 where the CPU has them): the page checksums
of features.bin."""
from __future__ import annotations

import errno
import os
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


#: The engine's page checksum paths, slowest first (gio.h): a byte table, SSE4.2's crc32
#: instruction, carry-less multiplication on 512-bit vectors (4 KiB pages only).
PAGE_CRC_PATHS = {"table": lib.GIO_CRC_TABLE, "sse4.2": lib.GIO_CRC_SSE42, "vpclmulqdq": lib.GIO_CRC_VPCLMUL}


#: Names a slower path for every checksum of this process (to compare the paths).
PATH_VARIABLE = "GNNSSD_PAGE_CRC"
if (os.environ.get(PATH_VARIABLE) or "vpclmulqdq") not in PAGE_CRC_PATHS:
    raise ValueError(f"{PATH_VARIABLE}={os.environ[PATH_VARIABLE]!r}: expected one of {', '.join(PAGE_CRC_PATHS)}")


def page_crc_path() -> str:
    """The path page_crc32c (and every checked read) takes: the fastest this CPU has, or
    a slower one named by GNNSSD_PAGE_CRC."""
    return next(name for name, path in PAGE_CRC_PATHS.items() if path == lib.gio_page_crc_path())


def page_crc32c(data: Any, page: int = PAGE, path: str | None = None) -> np.ndarray:
    """The CRC32C of every `page` bytes of data (the last page may be shorter), uint32; by
    `path` (a PAGE_CRC_PATHS name: that one where the CPU has it, else the next slower one
    it has), by default the fastest."""
    view = memoryview(data).cast("B")
    out = np.empty(-(-view.nbytes // page), dtype=np.uint32)
    if out.size:
        number = lib.gio_page_crc_path() if path is None else PAGE_CRC_PATHS[path]
        lib.gio_page_crcs_by(ffi.from_buffer("uint8_t[]", view), view.nbytes, page,
                             ffi.from_buffer("uint32_t[]", out), number)
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
