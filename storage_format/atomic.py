"""Durable file primitives: every store and run file is written through these.

A file becomes visible under its final name only after its bytes are on disk
(write to a temporary name, fsync, rename, fsync the directory), so a crash leaves
either the old file or the new one, never a torn mix.
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any, BinaryIO

CHUNK_BYTES = 16 << 20


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


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
