"""The one owner of every file gnnssd creates or replaces (store, run, output files).

A file becomes visible under its final name only after its bytes are on disk: it is
written to a fresh temporary name beside it (O_CREAT|O_EXCL|O_NOFOLLOW: a planted file or
symlink is never written through), fsynced and renamed, then the directory is fsynced; a
crash leaves the old file or the new one, never a torn mix. Before anything is written the
target is checked: an existing entry that is not a regular file (a symlink, a device such
as /dev/null or /dev/full, a FIFO, a folder) is refused rather than replaced, and so is
any target inside a store directory (a folder holding a gnnssd manifest.json) unless the
caller writes the store's own files (`into_store`).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

CHUNK_BYTES = 16 << 20
MANIFEST = "manifest.json"


class UnsafeOutputError(ValueError):
    """An output path gnnssd refuses to write: not a regular file, or inside a store."""


class OutputWriteError(OSError):
    """Writing an output failed (disk full, I/O error); the message names the file and disk
    (`reason`: the system's words, `disk`: which file system and its free space)."""

    reason = ""
    disk = ""

    def __str__(self) -> str:
        return str(self.strerror)  # the message alone, without "[Errno N]"


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def store_holding(path: Path) -> Path | None:
    """The store directory `path` would land in (its parent holds a manifest.json), or None."""
    parent = Path(path).parent
    return parent if os.path.lexists(parent / MANIFEST) else None


def check_output_target(path: Path, into_store: bool = False) -> None:
    """Refuse (UnsafeOutputError naming the path) a target gnnssd must not replace: an
    existing entry that is not a regular file of its own, or a file inside a store."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise UnsafeOutputError(f"{path}: is a symbolic link (to {os.readlink(path)}); gnnssd replaces "
                                "only regular files and never writes through a link: remove it or "
                                "choose another path")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise UnsafeOutputError(f"{path}: exists and is {_kind(info.st_mode)}, not a regular file; "
                                "gnnssd refuses to replace it: choose a file path")
    store = None if into_store else store_holding(path)
    if store is not None:
        raise UnsafeOutputError(f"{path}: inside the store {store} (it holds {MANIFEST}); gnnssd "
                                "writes no output into a store, which would replace or add to its "
                                "files: choose a path outside it")


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def write_error(path: Path, exc: OSError) -> OutputWriteError:
    """`exc` (raised writing `path`) as an error naming the file, its file system and its
    free space: a full disk says where, not only how many bytes were short."""
    parent = Path(path).parent
    try:
        free = f"{shutil.disk_usage(parent).free:,} bytes free"
    except OSError:
        free = "free space unknown"
    hint = "; free some space and retry" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    error = OutputWriteError(exc.errno or errno.EIO, f"{path}: cannot write ({exc.strerror or exc}) on the file "
                             f"system of {parent} ({free}){hint}; nothing was replaced")
    error.reason, error.disk = str(exc.strerror or exc), f"on the file system of {parent} ({free})"
    return error


@contextlib.contextmanager
def atomic_file(path: Path, into_store: bool = False) -> Iterator[BinaryIO]:
    """A binary file open for writing on a fresh temporary name beside `path`; on success
    it is fsynced and renamed over `path`, on any failure removed (`path` as it was). A
    write error is raised as OutputWriteError naming the file and its disk."""
    path = Path(path)
    check_output_target(path, into_store)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        with _synced(fd, "wb", path) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes, into_store: bool = False) -> None:
    with atomic_file(path, into_store) as f:
        f.write(data)


def atomic_write_json(path: Path, obj: Any, into_store: bool = False) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), into_store)


@contextlib.contextmanager
def appending(path: Path) -> Iterator[BinaryIO]:
    """`path` opened to append (created if absent), never through a symlink and only when
    it is a regular file: a log that grows a line at a time (metrics.jsonl)."""
    path = Path(path)
    check_output_target(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise write_error(path, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeOutputError(f"{path}: not a regular file; gnnssd appends only to its own log files")
    os.set_blocking(fd, True)
    with _synced(fd, "ab", path) as f:
        yield f


@contextlib.contextmanager
def _synced(fd: int, mode: str, path: Path) -> Iterator[BinaryIO]:
    """The open descriptor `fd` as a file, flushed and fsynced when the caller is done;
    a write error raised as OutputWriteError naming `path` and its disk."""
    with open(fd, mode) as f:
        try:
            yield f
            f.flush()
            os.fsync(f.fileno())
        except OSError as exc:
            raise write_error(path, exc) from None


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
