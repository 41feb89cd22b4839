"""What an earlier check of a store found, so that opening it again need not hash it again.

`Store.open` reads every file but features.bin whole for its CRC-32 and makes one pass of
content checks over the arrays: 17.6 s on the papers store, most of it the topology. After
a check passes, each file's identity (st_dev, st_ino, size, mtime_ns, ctime_ns) and the
CRC-32 it was found to have are written to a stamp file, with the manifest's fingerprint,
OUTSIDE the store: the user's cache folder ($GNNSSD_CACHE_DIR, else $XDG_CACHE_HOME/gnnssd,
else ~/.cache/gnnssd), so a read-only store benefits too and the store's own files are
untouched. A later open trusts a file whose identity and expected CRC-32 are those of its
stamp; any change (rewritten in place: mtime and ctime; replaced: inode; another store at
the path: inode and manifest) means the full check again. ctime is kept beside mtime
because only the kernel sets it: a file written and its mtime set back is still caught.

A file changed within the clock tick of its stamp could keep its times (the "racy" case of
git's index): a file changed less than RACY_NS before it is checked is not stamped (a new
store is stamped by its second open, not the one preprocess makes).

The cache is never required: a folder that cannot be made or written leaves open working,
hashing every time. A stamp that is not ours (not owned by this user, or writable by
others, in a folder writable by others), unreadable, malformed or for another store counts
as absent: it can only ever skip a check when it names exactly the files as they are.
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json
from .environment import env_optional
from .small_files import read_small_json

log = logging.getLogger(__name__)

CACHE_ENV = "GNNSSD_CACHE_DIR"
STAMP_FORMAT = "gnnssd-verified"
STAMP_VERSION = 1
#: A stamp lists a few dozen files; anything larger is not one.
STAMP_BYTES = 1 << 20
#: A file changed this recently is not stamped: timestamps are coarse (a jiffy on Linux,
#: seconds on some file systems), so a change in the same tick could keep them.
RACY_NS = 2_000_000_000
#: The identity fields of a file, then the CRC-32 its check found.
FIELDS = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def cache_dir() -> Path:
    """Where gnnssd keeps what it may recompute: $GNNSSD_CACHE_DIR, else
    $XDG_CACHE_HOME/gnnssd, else ~/.cache/gnnssd."""
    chosen = env_optional(CACHE_ENV)
    if chosen:
        return Path(chosen)
    xdg = env_optional("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "gnnssd"


def stamp_path(store_dir: Path) -> Path:
    """The stamp file of the store at `store_dir` (by its absolute path, resolved)."""
    store = str(Path(store_dir).resolve())
    return cache_dir() / "verified" / f"{hashlib.sha256(store.encode()).hexdigest()[:32]}.json"


def _private(info: os.stat_result) -> bool:
    """Owned by this user and writable by no one else: a stamp others could write could
    make a check be skipped."""
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


class VerifiedStamps:
    """The stamps of one store directory: which of its files are as a passing check found
    them (`unchanged`), recorded again as this check goes and saved once it has passed."""

    def __init__(self, store_dir: Path, fingerprint: str, trusted: bool = True):
        """`fingerprint`: the manifest's (Store.fingerprint); `trusted=False` ignores the
        stamps on file (a forced check: verify) but still saves what it finds."""
        self.store = str(Path(store_dir).resolve())
        self.path = stamp_path(store_dir)
        self.folder = self.path.parent
        self.fingerprint = fingerprint
        self._stamped = self._load() if trusted else None
        self._found: dict[str, list[int]] = {}
        self._all_unchanged = self._stamped is not None

    def _load(self) -> dict[str, list[int]] | None:
        """The stamped files of this store and manifest, or None: no stamp we can trust."""
        try:
            if not (_private(os.stat(self.folder)) and _private(os.lstat(self.path))):
                return None
            stamp: Any = read_small_json(self.path, STAMP_BYTES, "verified stamp")
        except (OSError, ValueError):
            return None
        if not (isinstance(stamp, dict) and stamp.get("format") == STAMP_FORMAT
                and stamp.get("version") == STAMP_VERSION and stamp.get("store") == self.store
                and stamp.get("manifest") == self.fingerprint and isinstance(stamp.get("files"), dict)):
            return None
        files = stamp["files"]
        if not all(isinstance(entry, list) and len(entry) == len(FIELDS) + 1
                   and all(type(v) is int for v in entry) for entry in files.values()):
            return None
        return files

    def unchanged(self, file: Path, crc: int) -> bool:
        """Whether `file` is as a passing check found it, holding CRC-32 `crc`. Its identity
        now is recorded for the stamp this check saves: call this before hashing the file,
        so a change while it is read shows as a change next time."""
        info = os.stat(file)
        entry = [*(getattr(info, field) for field in FIELDS), crc]
        if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) >= RACY_NS:
            self._found[file.name] = entry
        same = self._stamped is not None and self._stamped.get(file.name) == entry
        self._all_unchanged &= same
        return same

    @property
    def all_unchanged(self) -> bool:
        """Every file asked about is unchanged since a check of this very manifest passed:
        the content checks of that check hold still (they read nothing else)."""
        return self._all_unchanged

    def save(self) -> None:
        """Record the files as this passing check found them (when that differs from the
        stamp on file); a cache that cannot be written is left as it is."""
        if self._found == self._stamped or not self._found:
            return
        stamp = {"format": STAMP_FORMAT, "version": STAMP_VERSION, "store": self.store,
                 "manifest": self.fingerprint, "files": self._found}
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if _private(os.stat(self.folder)):
                atomic_write_json(self.path, stamp)
        except (OSError, ValueError) as exc:  # ValueError: atomic's UnsafeOutputError
            log.debug("verified stamp %s not written (%s); the next open checks %s again",
                      self.path, exc, self.store)
