"""Atomic checkpoints and the metrics log of a run directory."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from gnnssd.storage_format.atomic import fsync_dir

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> None:
    path = run_dir / CHECKPOINT
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(run_dir)


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CHECKPOINT
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu")
    except Exception as exc:  # torch.load raises many kinds on a damaged file
        raise RuntimeError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc})") from exc


class MetricsLog:
    """One JSON object per epoch, appended and synced as each epoch ends."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / METRICS

    def truncate_after(self, epoch: int) -> None:
        """Drop records of epochs past the checkpoint (their training is redone on resume)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("epoch", 0) <= epoch]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
