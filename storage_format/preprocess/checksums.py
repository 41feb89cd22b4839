"""The checksums of a store's files: the size and CRC-32 of each array (saved durably), and
the CRC32C of every page of features.bin."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from ..atomic import crc32_of_file, writable_file
from .disk_space import _writing
from . import features
from ..manifest import FEATURES, PAGE, PAGE_CHECKSUMS
from ..mapping import npy_header
from ..page_crc import page_crc32c

#: Entries widened at a time when a narrow array is saved in a wider dtype.
WIDEN_CHUNK = 1 << 22


def _maps(array: np.ndarray, path: Path) -> bool:
    """Whether `array` is a memory map of the file `path`."""
    return isinstance(array, np.memmap) and Path(array.filename or "").resolve() == path.resolve()


def _save_array(path: Path, array: np.ndarray, dtype: np.dtype | None = None) -> dict[str, int]:
    """`array` as the .npy file `path` (fsynced; its size and CRC32), in `dtype` when
    given: a 1-D array held narrow is widened a chunk at a time, not whole."""
    if _maps(array, path):
        with open(path, "rb") as f:  # written out of core by an earlier step: already a .npy
            os.fsync(f.fileno())
        return {"size": path.stat().st_size, "crc32": crc32_of_file(path)}
    with _writing(path, f"the array {path.stem}"), writable_file(path, path.parent) as f:
        if dtype is None or array.dtype == dtype:
            np.save(f, np.ascontiguousarray(array))
        elif array.ndim != 1:  # a link split's negatives: small
            np.save(f, array.astype(dtype))
        else:
            f.write(npy_header(np.dtype(dtype), array.shape[0]))
            for lo in range(0, array.shape[0], WIDEN_CHUNK):
                f.write(array[lo:lo + WIDEN_CHUNK].astype(dtype).data)
        f.flush()
        os.fsync(f.fileno())
    return {"size": path.stat().st_size, "crc32": crc32_of_file(path)}


def _write_page_checksums(partial: Path, notify: Callable[[str, int, int], None]) -> dict[str, int]:
    """features.crc32c: the CRC32C of every page of the finished features.bin (one
    sequential pass; rewritten whole by a resumed run)."""
    path = partial / PAGE_CHECKSUMS
    with (_writing(path, "the page checksums of features.bin"),
          open(partial / FEATURES, "rb") as src, writable_file(path, partial) as dst):
        total = os.fstat(src.fileno()).st_size
        while block := src.read(features.CHUNK_BYTES):
            dst.write(page_crc32c(block, PAGE).astype("<u4").tobytes())
            notify("page checksums", src.tell(), total)
        dst.flush()
        os.fsync(dst.fileno())
    return {"size": path.stat().st_size, "crc32": crc32_of_file(path)}
