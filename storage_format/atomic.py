"""The one owner of every file gnnssd creates or replaces (store, run, output files).

A file becomes visible under its final name only after its bytes are on disk: it is
written to a fresh temporary name beside it (O_CREAT|O_EXCL|O_NOFOLLOW: a planted file or
symlink is never written through), fsynced and renamed, then the directory is fsynced; a
crash leaves the old file or the new one, never a torn mix. Before anything is written the
target is checked: an existing entry that is not a regular file (a symlink, a device such
as /dev/null or /dev/full, a FIFO, a folder) is refused rather than replaced, and so is
any target inside a store directory (a folder holding a gnnssd manifest.json) unless the
caller writes the store's own files (`into_store`).

Files a command rewrites in place inside a folder of its own (a preprocess's partial folder:
arrays, feature rows appended by a resumed run, sort spills) open through `writable_file`
(never through a link, only a regular file of one link, only inside that folder), and the
lock files beside an output folder through `exclusive_lock`.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from .manifest import MANIFEST, is_store_manifest

CHUNK_BYTES = 16 << 20


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
    """The store directory `path` would land in, at any depth: its parent holding a
    manifest.json, or a folder above it holding a gnnssd store's manifest; else None."""
    parent = Path(path).parent
    if os.path.lexists(parent / MANIFEST):
        return parent
    return store_above(parent)


def store_above(folder: Path) -> Path | None:
    """The gnnssd store `folder` lies in (itself or a folder above it, links resolved), or None."""
    real = Path(os.path.realpath(folder))
    return next((f for f in (real, *real.parents) if is_store_manifest(f / MANIFEST)), None)


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
    disk = disk_of(Path(path).parent)
    hint = "; free some space and retry" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    error = OutputWriteError(exc.errno or errno.EIO, f"{path}: cannot write ({exc.strerror or exc}) {disk}{hint}; "
                             "nothing was replaced")
    error.reason, error.disk = str(exc.strerror or exc), disk
    return error


def disk_of(folder: Path) -> str:
    """Where a write into `folder` went, for an error: its file system and free space."""
    try:
        free = f"{shutil.disk_usage(folder).free:,} bytes free"
    except OSError:
        free = "free space unknown"
    return f"on the file system of {folder} ({free})"


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


def writable_file(path: Path, folder: Path, size: int = 0) -> BinaryIO:
    """`path`, a file of `folder` (a folder the command made for itself: a partial folder,
    a scratch folder), open for reading and writing with its first `size` bytes kept (cut
    or extended to `size`) and positioned there; created if absent. A resumed run appends
    to what it wrote before, so the file cannot be a fresh temporary: instead it is never
    opened through a link, must be a regular file with one link (not a planted hard link
    to someone's file) and must lie inside `folder` below no link (UnsafeOutputError)."""
    path = Path(path)
    _check_inside(path, Path(folder))
    fd = _open_own_file(path, "is a symbolic link")
    try:
        os.set_blocking(fd, True)
        os.ftruncate(fd, size)
        os.lseek(fd, size, os.SEEK_SET)
    except OSError as exc:
        os.close(fd)
        raise write_error(path, exc) from None
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "r+b")


def _open_own_file(path: Path, link_is: str) -> int:
    """`path` opened for reading and writing (created if absent, non-blocking: a FIFO does not
    hang the open), never through a link (UnsafeOutputError saying `path` `link_is`), and
    refused unless it is a regular file with one link."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeOutputError(f"{path}: {link_is} (to {os.readlink(path)}); gnnssd writes its working "
                                    "files and locks only as regular files of their own: remove it") from None
        raise write_error(path, exc) from None
    try:
        _check_own_file(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_own_file(fd: int, path: Path) -> None:
    """Refuse the open `fd` unless it is a regular file with one link."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeOutputError(f"{path}: exists and is {_kind(info.st_mode)}, not a regular file; gnnssd "
                                "writes its working files only as regular files: remove it")
    if info.st_nlink != 1:
        raise UnsafeOutputError(f"{path}: a regular file with {info.st_nlink} links (another name shares its "
                                "bytes); gnnssd writes only files of its own: remove it")


def _check_inside(path: Path, folder: Path) -> None:
    """Refuse `path` unless it names an entry inside `folder` with no link or `..` on the way."""
    try:
        parts = path.relative_to(folder).parts
    except ValueError:
        parts = ()
    if not parts or any(part in (".", "..") for part in parts):
        raise UnsafeOutputError(f"{path}: outside the folder {folder} it is written in; expected a file "
                                "inside it")
    for inner in (folder, *(folder.joinpath(*parts[:k]) for k in range(1, len(parts)))):
        if os.path.islink(inner):
            raise UnsafeOutputError(f"{path}: lies below the symbolic link {inner} (to {os.readlink(inner)}); "
                                    "gnnssd writes its working files only inside its own folders: remove it")


@contextlib.contextmanager
def exclusive_lock(path: Path, busy: Callable[[str], Exception]) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created, holding our pid, removed when
    done); another holder raises `busy(its pid)`. The lock file is opened without following
    a link and must be a regular file of one link (it is truncated). A lock taken on a file
    another holder removed meanwhile is retaken on the new file, so two never both hold it."""
    path = Path(path)
    while True:
        fd = _open_own_file(path, "the lock file is a symbolic link")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise busy(holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


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
