"""Atomic, checksummed checkpoints and the metrics log of a run directory.

A checkpoint never runs code when opened: it holds only tensors and plain types and is
read with `torch.load(weights_only=True)`. Its payload (the state, saved by torch) is stored
as a byte tensor beside its SHA-256, so a flipped byte is found before the state is used.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from gnnssd.core import ConfigError
from gnnssd.storage_format import Store, fsync_dir

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
FORMAT = "gnnssd-checkpoint-1"

log = logging.getLogger("gnnssd.training.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be used; the message names the file and the fault."""


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> None:
    """Write `state` (tensors and plain types only) atomically with its checksum. Serialised
    in memory first, so a full disk is a plain write error (torch's own writer reports it
    as "unexpected pos"): the error names the file, the temporary file goes, and the
    previous checkpoint stays."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    wrapped = {"format": FORMAT, "sha256": hashlib.sha256(payload).hexdigest(),
               "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8)}
    data = io.BytesIO()
    torch.save(wrapped, data)
    path = run_dir / CHECKPOINT
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.getbuffer())
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"{path}: cannot write the checkpoint ({exc.strerror or exc}; "
                              f"{data.getbuffer().nbytes:,} bytes); the previous checkpoint is "
                              "unchanged: free space and resume with --resume") from None
    os.replace(tmp, path)
    fsync_dir(run_dir)


def load_checkpoint(run_dir: Path, store: Store | None = None) -> dict[str, Any] | None:
    """The state saved in `run_dir`, or None; never unpickles anything but tensors and
    plain types, and refuses a file whose payload does not match its checksum, and (given
    `store`) one trained on another store (`check_store`)."""
    path = run_dir / CHECKPOINT
    if not path.exists():
        return None
    wrapped = _safe_load(path, path)
    if not (isinstance(wrapped, dict) and wrapped.get("format") == FORMAT
            and isinstance(wrapped.get("payload"), torch.Tensor)):
        raise CheckpointError(f"{path}: not a gnnssd checkpoint (no {FORMAT!r} header); it may "
                              "come from an older gnnssd or another program")
    payload = wrapped["payload"].numpy().tobytes()
    digest = hashlib.sha256(payload).hexdigest()
    if digest != wrapped["sha256"]:
        raise CheckpointError(f"{path}: corrupt checkpoint: payload sha256 {digest[:16]}..., "
                              f"recorded {str(wrapped['sha256'])[:16]}...")
    state = _safe_load(io.BytesIO(payload), path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: the payload is {type(state).__name__}, expected a dict")
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


def _safe_load(source: Path | io.BytesIO, path: Path) -> Any:
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many kinds on a damaged or hostile file
        raise CheckpointError(
            f"{path}: refused to load: it does not load as tensors and plain values only "
            f"(torch.load weights_only=True: {type(exc).__name__}: {str(exc).splitlines()[0]}); "
            "it is damaged, or not a gnnssd checkpoint, and may contain code") from None


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
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self, drop_torn: bool = False) -> list[dict[str, Any]]:
        """The records; a bad line is an error naming the file and line, except the last
        one when `drop_torn` (a write cut short), which is dropped with a warning."""
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
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
