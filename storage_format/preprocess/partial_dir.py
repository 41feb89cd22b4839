"""The one policy of output folders (preprocess's store, export's dataset, the demo's
folder): the checks on --out (never inside a store, never replacing files the command did
not make), the lock beside it (a second writer refused), the `.NAME.partial` folder the
output is built in (preprocess resumes it when an identical run was interrupted) and the
final swap into place. Only folders carrying the command's marker file (OWNER_MARKER) are
resumed, moved or deleted."""
from __future__ import annotations

import logging
import os
import shutil
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator

from ..atomic import atomic_write_json, exclusive_lock, fsync_dir, store_above
from .disk_space import _writing
from ..errors import StoreError
from ..manifest import MANIFEST, foreign_entries, is_store_manifest
from .progress import PROGRESS
from ..small_files import read_small_json

log = logging.getLogger(__name__)

HEAD_BYTES = 1 << 20  # of each input file, checksummed for the resume key
#: The marker file of the folders preprocess makes beside --out (.NAME.partial, .NAME.old),
#: naming gnnssd and --out: a folder of those names without it is the user's, never touched.
OWNER_MARKER = ".gnnssd-preprocess.json"
MADE_BY = "gnnssd preprocess"


def _check_no_overlap(out: Path, inputs: list[Path]) -> None:
    target = out.resolve()
    for path in inputs:
        if target == path or path in target.parents or target in path.parents:
            raise StoreError(f"--out {out}: overlaps the input {path}; write the store to a "
                             "folder outside the input files")


def _check_destination(out: Path) -> None:
    """Replace only what preprocess made: a store, or an empty folder; reuse or delete
    only a .NAME.partial beside it that preprocess made."""
    if os.path.lexists(_partial_dir(out)):
        _check_ours(_partial_dir(out), out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise StoreError(f"--out {out}: exists and is not a directory; refusing to replace "
                         "it (choose another --out)")
    if out.is_dir() and any(out.iterdir()) and not is_store_manifest(out / MANIFEST):
        raise StoreError(f"--out {out}: an existing folder that is not a gnnssd store (no "
                         f"gnnssd {MANIFEST}); refusing to replace its contents (choose a new "
                         "or empty folder)")
    foreign = foreign_entries(out) if out.is_dir() else []
    if foreign:
        raise StoreError(f"--out {out}: the store holds {len(foreign)} entries that are not its own "
                         f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); replacing the "
                         "store would delete them: move them out first")


@contextmanager
def output_lock(out: Path, made_by: str = MADE_BY, argument: str = "--out") -> Iterator[None]:
    """Hold an exclusive lock on `out`: the file .NAME.lock beside it (atomic.exclusive_lock:
    never a link, holding our pid, removed when done); a second writer is refused, and so
    is an `out` inside a store (before any folder is made for it). Errors name `out` as the
    command's `argument`."""
    _check_not_in_store(out, argument)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f".{out.name}.lock"
    what = "this store" if made_by == MADE_BY else "this folder"

    def busy(holder: str) -> StoreError:
        return StoreError(f"{argument} {out}: another {made_by} (pid {holder}) is writing {what} (lock {path}); "
                          "wait for it to finish")

    with exclusive_lock(path, busy):
        yield


def _check_not_in_store(out: Path, argument: str) -> None:
    """Refuse an output folder inside a store (at any depth): its files are the store's."""
    store = store_above(out.parent)
    if store is not None:
        raise StoreError(f"{argument} {out}: inside the store {store} (it holds {MANIFEST}); gnnssd writes no "
                         "output into a store, which would add to its files: choose a folder outside it")


def _input_identity(inputs: list[Path]) -> list[dict[str, Any]]:
    """Path, size, mtime and the CRC-32 of the first MiB of every input file (all files
    under an input folder): what an interrupted preprocess must match to be resumed."""
    identity = []
    for root in inputs:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            stat = path.stat()
            with open(path, "rb") as f:
                head = zlib.crc32(f.read(HEAD_BYTES))
            identity.append({"path": str(path), "size": stat.st_size,
                             "mtime_ns": stat.st_mtime_ns, "head_crc32": head})
    return identity


def _partial_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def _old_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.old"


def _mark(folder: Path, out: Path, made_by: str = MADE_BY) -> None:
    """Sign `folder` (.NAME.partial, or the store about to become .NAME.old) as `made_by`'s."""
    with _writing(folder / OWNER_MARKER, f"the {made_by} marker"):
        atomic_write_json(folder / OWNER_MARKER, {"made_by": made_by, "target": out.name}, into_store=True)


def _check_ours(folder: Path, out: Path, made_by: str = MADE_BY) -> None:
    """Refuse `folder` (.NAME.partial or .NAME.old beside `out`) unless `made_by` made it
    (or it is an empty folder: a kill between its mkdir and its marker leaves one): only
    then may it be deleted, resumed or moved into place."""
    if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        return
    marker = None
    if folder.is_dir() and not folder.is_symlink():
        with suppress(OSError, ValueError):
            marker = read_small_json(folder / OWNER_MARKER)
    if not (isinstance(marker, dict) and marker.get("made_by") == made_by
            and marker.get("target") == out.name):
        raise StoreError(f"{folder}: not made by {made_by} (no {OWNER_MARKER} naming "
                         f"--out {out.name}); refusing to delete or reuse it (move it away or "
                         "choose another --out)")


def _open_partial_dir(out: Path, params: dict[str, Any]) -> Path:
    """Reuse a partial directory left by an identical interrupted run, else start afresh
    (the folder is preprocess's: _check_destination checked its marker)."""
    partial = _partial_dir(out)
    progress_file = partial / PROGRESS
    if partial.exists():
        try:
            same = read_small_json(progress_file).get("params") == params
        except (OSError, ValueError):
            same = False
        if same:
            log.info("resuming the interrupted preprocess in %s", partial)
            return partial
        shutil.rmtree(partial)
    partial.mkdir()
    _mark(partial, out)
    with _writing(progress_file, "the preprocess progress record"):
        atomic_write_json(progress_file, {"params": params, "files": {}}, into_store=True)
    return partial


def _restore_interrupted_swap(out: Path) -> None:
    """A crash between the two renames of the swap leaves the old store at .NAME.old."""
    old = _old_dir(out)
    if os.path.lexists(old):
        _check_ours(old, out)
        if out.exists():
            shutil.rmtree(old)
        else:
            os.rename(old, out)
            (out / OWNER_MARKER).unlink(missing_ok=True)


def _swap_into_place(partial: Path, out: Path) -> None:
    old = _old_dir(out)
    if out.exists():
        _mark(out, out)  # a store or an empty folder (_check_destination), soon .NAME.old
        os.rename(out, old)
    os.rename(partial, out)
    fsync_dir(out.parent)
    (out / OWNER_MARKER).unlink(missing_ok=True)
    if old.exists():
        shutil.rmtree(old)


@contextmanager
def new_output_folder(out: Path, made_by: str, argument: str,
                      refuse: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Output-folder policy for a command that writes a whole new folder `out` (export):
    refused inside a store, or when `out` holds anything (`refuse(out)` may first name what
    it finds, e.g. an earlier output); locked (.NAME.lock beside it: a second writer is
    refused); written into a fresh .NAME.partial (yielded, marked as `made_by`'s) that is
    renamed to `out` when the block ends and removed when it fails, so a full disk or a
    crash leaves no half output under `out`. Errors name `out` as the command's `argument`."""
    out = Path(out)
    with output_lock(out, made_by, argument):
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            raise StoreError(f"{argument} {out}: exists and is not a directory; choose a new folder")
        if out.is_dir() and any(out.iterdir()):
            if refuse is not None:
                refuse(out)
            found = sorted(p.name for p in out.iterdir())
            raise StoreError(f"{argument} {out}: a folder holding files {made_by} did not make "
                             f"({', '.join(found[:5])}{', ...' if len(found) > 5 else ''}); it writes only "
                             "into a new or empty folder: choose another")
        partial = _partial_dir(out)
        if os.path.lexists(partial):  # left by a killed run
            _check_ours(partial, out, made_by)
            shutil.rmtree(partial)
        partial.mkdir()
        try:
            _mark(partial, out, made_by)
            yield partial
            os.rename(partial, out)  # over an empty folder too
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        fsync_dir(out.parent)
        (out / OWNER_MARKER).unlink()
