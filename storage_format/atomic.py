"""Durable file primitives: every store and run file is written through these.

A file becomes visible under its final name only after its bytes are on disk
(write to a temporary name, fsync, rename, fsync the directory), so a crash leaves
either the old file or the new one, never a torn mix.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

CHUNK_BYTES = 16 << 20


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside `path` (unique per call, created with O_EXCL and
    O_NOFOLLOW: a planted file or symlink is never written through) to write in full;
    on success it is fsynced and renamed over `path` (replacing a symlink there, not
    its target), on any failure removed, leaving `path` as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_output(path) as tmp, open(os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW), "wb") as f:
        f.write(data)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def crc32_of_file(path: Path, chunk_bytes: int = CHUNK_BYTES) -> int:
    """CRC-32 of a whole file, read in chunks (bounded memory)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            crc = zlib.crc32(block, crc)
    return crc


class ChecksummedWriter:
    """Appends to a file while keeping its running CRC-32 (resumable: CRC-32 can continue)."""

    def __init__(self, f: BinaryIO, crc: int = 0, size: int = 0):
        self.file = f
        self.crc = crc
        self.size = size

    def write(self, data: bytes | memoryview) -> None:
        self.file.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.size += memoryview(data).nbytes

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
