"""Disk space: refusing a preprocess the filesystem cannot hold, and naming the file and its
content when a write runs out of space anyway."""
from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import StoreError


class DiskFullError(StoreError):
    """The filesystem filled up while preprocess wrote the store."""


@contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """Name the file and its content when writing it runs out of space."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise DiskFullError(f"no space left on the device while writing {what} to {path}") from None


def _check_free_space(out: Path, partial: Path, needed: int) -> None:
    """Refuse before writing anything when the filesystem of `out` cannot hold what
    preprocess will write (what an interrupted run left in `partial` counts as written)."""
    have = sum(p.stat().st_size for p in partial.iterdir() if p.is_file()) if partial.is_dir() else 0
    free = shutil.disk_usage(out.parent).free
    if needed - have > free:
        raise DiskFullError(f"--out {out}: not enough free disk; preprocess needs about "
                            f"{_mib(needed - have)} free there ({_mib(free)} free now) on the "
                            f"filesystem of {out.parent}; free some space or choose another --out")


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"
