"""A run directory's lock and its scratch space.

One writer (train) holds an exclusive lock; readers (eval, predict) share a lock; the two
exclude each other, and a refused process learns at once which pid holds the directory.
Scratch files (compact blocks, spilled plans) go to `.gnnssd-scratch/<pid>-<token>/`, a
directory each process makes for itself, so nothing gnnssd deletes was written by anyone else.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Iterator

from gnnssd.core import ConfigError
from gnnssd.storage_format import UnsafeOutputError, atomic_write_bytes, check_output_target

log = logging.getLogger("gnnssd.training.rundir")

LOCK = ".gnnssd-lock"
SCRATCH = ".gnnssd-scratch"


class RunDirBusy(RuntimeError):
    """Another process holds the run directory's lock."""


def refuse_symlink(path: Path) -> None:
    """A run directory entry gnnssd writes or deletes must not be a symbolic link: one
    planted there (run dirs under a shared /tmp) would redirect the write or deletion."""
    if path.is_symlink():
        raise ConfigError(f"run_dir: {path} is a symbolic link (to {os.readlink(path)}); "
                          "gnnssd writes only its own files there: remove the link")


def check_output(out: Path, run_dir: Path) -> None:
    """An output path (predict/embed --out) that would replace a file of the run, the run
    directory's scratch or lock, or a folder, is refused before anything is computed."""
    from .checkpoint import CHECKPOINT, METRICS

    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out}: a folder; give the path of an .npy file")
    try:
        check_output_target(out)
    except UnsafeOutputError as exc:
        raise ConfigError(f"--out {exc}") from None
    own = {CHECKPOINT, METRICS, "run_config.yaml", LOCK, SCRATCH}
    resolved_dir = out.parent.resolve()
    if resolved_dir == run_dir.resolve() and out.name in own or run_dir.resolve() / SCRATCH in (
            resolved_dir, *resolved_dir.parents):
        raise ConfigError(f"--out {out}: would replace the run's own {out.name} in {run_dir}; "
                          "write elsewhere")


def write_run_file(path: Path, text: str) -> None:
    """Replace a run directory file atomically; a symlink in its place is refused."""
    atomic_write_bytes(path, text.encode())


def prepare_run_dir(path: Path, create: bool) -> None:
    """Check (and with `create`, make) the run directory; a ConfigError names the key."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run_dir: {path} is a file, not a directory")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"run_dir: cannot create {path} ({exc.strerror})") from None
    if not path.is_dir():
        raise ConfigError(f"run_dir: {path} does not exist; train first")
    if create and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir: {path} is not writable")


class RunLock:
    """An fcntl lock on `run_dir/.gnnssd-lock`, held until `release()`. The lock file is
    opened without following a symlink. A reader of a run directory it cannot write to
    (read-only file system or permissions) locks the existing file read-only, or, when
    there is none, reads unlocked: no writer can use that directory either."""

    def __init__(self, run_dir: Path, exclusive: bool):
        self.run_dir = run_dir
        self.exclusive = exclusive
        self._writable = True
        path = run_dir / LOCK
        refuse_symlink(path)
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exclusive or exc.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise ConfigError(f"run_dir: cannot open the lock file {path} ({exc.strerror})") from None
            self._writable = False
            try:
                self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                log.info("%s is read-only and has no lock file: reading it unlocked", run_dir)
                self._fd = -1
                return
            except OSError as exc2:
                raise ConfigError(f"run_dir: cannot open the lock file {path} ({exc2.strerror})") from None
        info = os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(self._fd)
            raise ConfigError(f"run_dir: the lock file {path} is not a plain file of its own "
                              f"({info.st_nlink} links); gnnssd truncates it: remove it")
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as exc:
            holder = self._holder()
            os.close(self._fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise RunDirBusy(f"{run_dir}: in use by {holder}; wait for it to finish or pick "
                             "another run_dir") from None
        if self._writable:
            os.ftruncate(self._fd, 0)  # a pid left here by a killed writer is stale
        if exclusive:
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def _holder(self) -> str:
        """Who holds the lock: the writer's pid (writers record it), else readers."""
        pid = os.pread(self._fd, 32, 0).decode(errors="replace").strip()
        return f"training process pid {pid}" if pid.isdigit() else "eval/predict (a reader)"

    def release(self) -> None:
        if self._fd < 0:
            return
        if self.exclusive:
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = -1


class Scratch:
    """This process's own scratch directory under `run_dir/.gnnssd-scratch/`."""

    def __init__(self, run_dir: Path):
        self.root = run_dir / SCRATCH
        self.path = self.root / f"{os.getpid()}-{secrets.token_hex(4)}"
        refuse_symlink(self.root)

    def remove(self) -> None:
        """Delete this process's scratch directory (and the parent when it is left empty)."""
        shutil.rmtree(self.path, ignore_errors=True)
        try:
            self.root.rmdir()
        except OSError:
            pass  # other processes' scratch, or never made

    def clear_stale(self) -> None:
        """Remove scratch left by interrupted processes. Only under the writer's lock:
        no other gnnssd process can be using the run directory then."""
        refuse_symlink(self.root)
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry == self.path:
                continue
            log.info("removing stale scratch %s", entry)
            if entry.is_symlink() or not entry.is_dir():
                entry.unlink()  # the link itself, never what it points to
            else:
                shutil.rmtree(entry, ignore_errors=True)  # rmtree does not follow links inside


@contextlib.contextmanager
def reading(run_dir: Path) -> Iterator[Scratch]:
    """A reader's shared lock on an existing run directory and this process's scratch
    directory in it (commands that read a trained run without a Trainer: embed, predict
    --layerwise); both released on exit."""
    prepare_run_dir(run_dir, create=False)
    lock = RunLock(run_dir, exclusive=False)
    scratch = Scratch(run_dir)
    try:
        yield scratch
    finally:
        scratch.remove()
        lock.release()
