"""Atomic, checksummed checkpoints and the metrics log of a run directory.

A checkpoint never runs code when opened: it is a state file (`state_file`: tensors' raw
bytes and a JSON tree of plain values, with its SHA-256), read without unpickling. The
pickle-based checkpoints of earlier gnnssd versions are refused, not loaded: torch 2.2.1's
`weights_only` loader has published bypasses.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from gnnssd.core import ConfigError
from gnnssd.storage_format import (OutputWriteError, SmallFileError, Store, appending, atomic_file, atomic_write_bytes,
                                   read_regular, read_small_text)

from .state_file import StateFileError, decode_state, encode_state

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
#: Far above any model gnnssd trains: a bound, so a link or device is never read forever.
CHECKPOINT_BYTES = 1 << 40
METRICS_BYTES = 1 << 30

log = logging.getLogger("gnnssd.training.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be used; the message names the file and the fault."""


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> None:
    """Write `state` (tensors and plain values only) atomically with its checksum. Encoded
    in memory first; a full disk is an error naming the file and its disk, the temporary
    file goes, and the previous checkpoint stays."""
    path = run_dir / CHECKPOINT
    data = encode_state(state)
    try:
        with atomic_file(path) as f:
            f.write(data)
    except OutputWriteError as exc:
        raise CheckpointError(f"{path}: cannot write the checkpoint ({exc.reason}; {len(data):,} bytes) "
                              f"{exc.disk}; the previous checkpoint is unchanged: free space and "
                              "resume with --resume") from None


def load_checkpoint(run_dir: Path, store: Store | None = None) -> dict[str, Any] | None:
    """The state saved in `run_dir`, or None; never unpickles anything, and refuses a
    file whose bytes do not match its checksum, and (given `store`) one trained on
    another store (`check_store`)."""
    path = run_dir / CHECKPOINT
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = read_regular(path, CHECKPOINT_BYTES, "checkpoint")
    except SmallFileError as exc:
        raise CheckpointError(str(exc)) from None
    if data[:2] == b"PK" or data[:1] == b"\x80":
        raise CheckpointError(f"{path}: a pickle-based checkpoint (torch.save, as gnnssd wrote before "
                              "its state-file format); refused: unpickling can run code on this torch. "
                              "Train again into a new run_dir")
    try:
        state = decode_state(data)
    except StateFileError as exc:
        raise CheckpointError(f"{path}: not a usable gnnssd checkpoint: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, expected a dict of state")
    if store is not None:
        check_store(state, store, run_dir)
    return state


def check_store(checkpoint: dict[str, Any], store: Store, run_dir: Path) -> None:
    """Refuse a checkpoint of `run_dir` trained on another store than `store` (or on this
    one before it was preprocessed again): their manifest digests differ."""
    fingerprint = checkpoint.get("store")
    if not isinstance(fingerprint, str):
        raise CheckpointError(f"{run_dir / CHECKPOINT}: not a checkpoint of this gnnssd (no "
                              "store fingerprint)")
    if fingerprint != store.fingerprint:
        raise ConfigError(f"store: {store.path} is not the store the checkpoint in {run_dir} was "
                          f"trained on (manifest sha256 {store.fingerprint[:12]}, checkpoint "
                          f"{fingerprint[:12]}): another store, or preprocessed again since; "
                          "pick another run_dir")


class MetricsLog:
    """One JSON object per epoch, appended and synced as each epoch ends."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / METRICS

    def truncate_after(self, epoch: int) -> None:
        """Drop records of epochs past the checkpoint (their training is redone on resume),
        and a torn last line (the epoch being written when the run stopped)."""
        if not self.path.exists():
            return
        kept = [json.dumps(r, sort_keys=True) for r in self.read(drop_torn=True)
                if r.get("epoch", 0) <= epoch]
        atomic_write_bytes(self.path, "".join(line + "\n" for line in kept).encode())

    def append(self, record: dict[str, Any]) -> None:
        with appending(self.path) as f:
            f.write((json.dumps(record, sort_keys=True) + "\n").encode())

    def read(self, drop_torn: bool = False) -> list[dict[str, Any]]:
        """The records; a bad line is an error naming the file and line, except the last
        one when `drop_torn` (a write cut short), which is dropped with a warning."""
        if not self.path.exists() and not self.path.is_symlink():
            return []
        try:
            lines = read_small_text(self.path, METRICS_BYTES, "metrics log").splitlines()
        except SmallFileError as exc:
            raise CheckpointError(str(exc)) from None
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"a JSON {type(record).__name__}, expected an object")
            except ValueError as exc:
                if drop_torn and number == len(lines):
                    log.warning("%s: dropping a torn last line %d (%s)", self.path, number, exc)
                    continue
                raise CheckpointError(f"{self.path}: line {number} is not a metrics record "
                                      f"({exc})") from None
            records.append(record)
        return records
