"""Arrays inside a .npz (zip) file, streamed: the member's .npy header first, then its data
in blocks, whether the member is stored or deflated. Nothing is loaded whole unless asked.
"""
from __future__ import annotations

import math
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

import numpy as np

from gnnssd.storage_format import DatasetError

from .base import require_file

#: What reading a damaged archive raises: a truncated deflate stream, a bad CRC, a short file.
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError)


class NpzMember:
    """Array `name` of the .npz file `path`: its shape and dtype from the header alone."""

    def __init__(self, path: Path, name: str):
        self.path = require_file(Path(path))
        self.name = name
        self.member = f"{name}.npy"
        try:
            with zipfile.ZipFile(self.path) as archive:
                names = archive.namelist()
        except ZIP_ERRORS as exc:
            raise DatasetError(f"{self.path}: not a readable .npz (zip) file ({exc})") from exc
        if self.member not in names:
            raise DatasetError(f"{self.path}: missing member {self.member!r} (has {sorted(names)})")
        with self._opened() as f:
            try:
                version = np.lib.format.read_magic(f)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read_header is None:
                    raise ValueError(f".npy format version {version} is not supported")
                shape, self.fortran_order, self.dtype = read_header(f)
            except ValueError as exc:
                raise DatasetError(f"{self}: not a .npy array ({exc})") from exc
            self.data_offset = f.tell()
        self.shape: tuple[int, ...] = tuple(shape)
        if self.dtype.hasobject:
            raise DatasetError(f"{self}: holds Python objects; expected a numeric array")

    def __str__(self) -> str:
        return f"{self.path}: member {self.member!r}"

    @contextmanager
    def _opened(self) -> Iterator[IO[bytes]]:
        try:
            with zipfile.ZipFile(self.path) as archive, archive.open(self.member) as f:
                yield f
        except ZIP_ERRORS as exc:
            raise DatasetError(f"{self}: cannot be read, the archive is damaged or truncated "
                               f"({type(exc).__name__}: {exc})") from exc

    def expect(self, shape: tuple[int | None, ...], what: str) -> None:
        """Refuse a non-numeric member or one whose shape is not `shape` (None: any size)."""
        fits = len(self.shape) == len(shape) and all(
            want is None or have == want for have, want in zip(self.shape, shape))
        if not fits or self.dtype.kind not in "iuf":
            raise DatasetError(f"{self}: shape {self.shape} dtype {self.dtype}, expected {what}")

    def read(self) -> np.ndarray:
        """The whole array (for small members: labels, counts)."""
        with self._opened() as f:
            f.seek(self.data_offset)
            return _read_exactly(f, self.dtype, math.prod(self.shape), self).reshape(
                self.shape, order="F" if self.fortran_order else "C")

    def row_blocks(self, start_row: int, block_rows: int) -> Iterator[np.ndarray]:
        """Rows start_row.. of a C-order array, `block_rows` at a time."""
        if self.fortran_order and len(self.shape) > 1:
            raise DatasetError(f"{self}: stored in Fortran order; expected C order (rows contiguous)")
        row_items = math.prod(self.shape[1:])
        with self._opened() as f:
            f.seek(self.data_offset + start_row * row_items * self.dtype.itemsize)
            for lo in range(start_row, self.shape[0], block_rows):
                rows = min(block_rows, self.shape[0] - lo)
                yield _read_exactly(f, self.dtype, rows * row_items, self).reshape(rows, *self.shape[1:])

    def pair_blocks(self, block: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(row 0, row 1) of a (2, E) array, `block` columns at a time: two streams into
        the member for C order, one stream of interleaved pairs for Fortran order."""
        total = self.shape[1]
        if self.fortran_order:
            with self._opened() as f:
                f.seek(self.data_offset)
                for lo in range(0, total, block):
                    pairs = _read_exactly(f, self.dtype, 2 * min(block, total - lo), self)
                    yield pairs[0::2], pairs[1::2]
            return
        with self._opened() as first, self._opened() as second:
            first.seek(self.data_offset)
            second.seek(self.data_offset + total * self.dtype.itemsize)
            for lo in range(0, total, block):
                n = min(block, total - lo)
                yield (_read_exactly(first, self.dtype, n, self),
                       _read_exactly(second, self.dtype, n, self))


def _read_exactly(f: IO[bytes], dtype: np.dtype, count: int, where: NpzMember) -> np.ndarray:
    out = np.empty(count, dtype=dtype)
    view = memoryview(out).cast("B")
    done = 0
    while done < view.nbytes:
        got = f.readinto(view[done:])
        if not got:
            raise DatasetError(f"{where}: ends {view.nbytes - done} bytes early; the archive is "
                               "truncated")
        done += got
    return out
