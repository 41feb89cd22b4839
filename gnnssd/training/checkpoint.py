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

import torch

from gnnssd.core import ConfigError
from gnnssd.storage_format import (OutputWriteError, SmallFileError, Store, StoreError, appending, atomic_file, atomic_write_bytes,
                                   opened_regular, read_small_text, shown)

from .state_file import StateFileError, encode_state, read_state

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
#: A checkpoint read without its model to size it (tests, tools): far above any model
#: gnnssd trains; a bound, so a link or device is never read forever.
CHECKPOINT_BYTES = 1 << 40
#: What a run's checkpoint holds besides its tensors' bytes: per tensor its header entry and
#: alignment (and Adam's step count), and the tree (config, RNG states: some KiB).
TENSOR_OVERHEAD_BYTES = 4096
TREE_BYTES = 64 << 20
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


def checkpoint_limit(model: torch.nn.Module) -> int:
    """The most bytes a run's checkpoint of `model` may take: its tensors four times (the
    latest weights, the best ones, Adam's two moments) with their overhead, and the tree."""
    tensors = list(model.state_dict().values())
    return 4 * sum(t.numel() * t.element_size() + TENSOR_OVERHEAD_BYTES for t in tensors) + TREE_BYTES


def load_checkpoint(run_dir: Path, store: Store | None = None,
                    model: torch.nn.Module | None = None) -> dict[str, Any] | None:
    """The state saved in `run_dir`, or None; never unpickles anything, and refuses a
    file whose bytes do not match its checksum, and (given `store`) one trained on
    another store (`check_store`). Given the run's `model`, the file may be no larger than
    a checkpoint of it (`checkpoint_limit`) and its tree must have a run's shape
    (`check_run_state`). Read and hashed in chunks (a sparse 8 GiB file was read into one
    buffer before its SHA-256); no fault of the file ends in a traceback that does not
    name it."""
    path = run_dir / CHECKPOINT
    if not path.exists() and not path.is_symlink():
        return None
    limit, what = (CHECKPOINT_BYTES, "checkpoint") if model is None else (
        checkpoint_limit(model), "checkpoint of this run's model (4x its weights and their overhead)")
    try:
        with opened_regular(path, limit, what) as (file, size):
            head = file.read(2)
            if head == b"PK" or head[:1] == b"\x80":
                raise CheckpointError(f"{path}: a pickle-based checkpoint (torch.save, as gnnssd wrote before "
                                      "its state-file format); refused: unpickling can run code on this torch. "
                                      "Train again into a new run_dir")
            file.seek(0)
            state = read_state(file, size)
    except SmallFileError as exc:
        raise CheckpointError(str(exc)) from None
    except StateFileError as exc:
        raise CheckpointError(f"{path}: not a usable gnnssd checkpoint: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({exc.strerror or exc})") from None
    except MemoryError:
        raise CheckpointError(f"{path}: its tensors need more memory than is available") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, expected a dict of state")
    if model is not None:
        check_run_state(state, path)
    if store is not None:
        check_store(state, store, run_dir)
    return state


#: A run's checkpoint: TaskTrainer._state's keys.
RUN_STATE_KEYS = ("best", "config", "epoch", "model", "optimizer", "rng", "store", "world_size")
#: np.random.get_state()'s MT19937 key: 624 words, and the position in it.
MT_WORDS = 624


def check_run_state(state: dict[str, Any], path: Path) -> None:
    """The one check of a run checkpoint's tree (what TaskTrainer._state writes): each key of
    the wrong type or shape is a CheckpointError naming the key and `path` (a config that
    is a list, an RNG state of 3 bytes or a `best` without its keys failed deep in json,
    torch or NumPy, naming no file). Whether the tensors fit the model is the trainer's
    check (`_check_fits`)."""
    def refuse(key: str, value: Any, expected: str) -> CheckpointError:
        return CheckpointError(f"{path}: key {key!r} is {shown(value, 100)}; expected {expected}")

    missing = [key for key in RUN_STATE_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{path}: not a checkpoint of a gnnssd run: no {', '.join(map(repr, missing))}")
    if not _is_int(state["epoch"], 0):
        raise refuse("epoch", state["epoch"], "an integer from 0")
    if not _is_int(state["world_size"], 1):
        raise refuse("world_size", state["world_size"], "a positive integer")
    if not isinstance(state["store"], str):
        raise refuse("store", state["store"], "the store's manifest digest (a string)")
    try:
        config = json.loads(state["config"]) if isinstance(state["config"], str) else None
    except (ValueError, RecursionError):
        config = None
    if not isinstance(config, dict):
        raise refuse("config", state["config"], "the run's config as a JSON object")
    if not _is_tensors(state["model"]):
        raise refuse("model", state["model"], "a dict of tensors by name")
    _check_optimizer(state["optimizer"], refuse)
    _check_best(state["best"], state["epoch"], refuse)
    _check_rng(state["rng"], refuse)


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_tensors(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())


def _check_optimizer(optimizer: Any, refuse: Any) -> None:
    """torch.optim's state_dict: per-parameter state by index, and the parameter groups."""
    if not (isinstance(optimizer, dict) and set(optimizer) == {"state", "param_groups"}
            and isinstance(optimizer["state"], dict) and isinstance(optimizer["param_groups"], list)
            and all(isinstance(group, dict) and isinstance(group.get("params"), list)
                    and all(_is_int(p, 0) for p in group["params"]) for group in optimizer["param_groups"])
            and all(_is_int(k, 0) and isinstance(v, dict) for k, v in optimizer["state"].items())):
        raise refuse("optimizer", optimizer, "an optimizer state_dict ({'state': {index: {...}}, "
                     "'param_groups': [{'params': [index, ...], ...}]})")


def _check_best(best: Any, epoch: int, refuse: Any) -> None:
    """{valid_S, test_S, epoch, state} for the task's selection score S (test_S absent in a
    checkpoint written before any evaluation by an earlier version)."""
    valid = [k for k in best if isinstance(k, str) and k.startswith("valid_")] if isinstance(best, dict) else []
    test = f"test_{valid[0].removeprefix('valid_')}" if len(valid) == 1 else None
    if not (len(valid) == 1 and set(best) <= {"epoch", "state", valid[0], test}
            and {"epoch", "state", valid[0]} <= set(best)):
        raise refuse("best", best, "{'valid_S': score, 'test_S': score or None, 'epoch': e, 'state': "
                     "weights or None} for the task's selection score S")
    (valid,) = valid
    if not (_is_number(best[valid]) and (best.get(test) is None or _is_number(best[test]))):
        raise refuse(f"best.{valid}", (best[valid], best.get(test)), "numbers (the test score may be None)")
    if not (_is_int(best["epoch"], 0) and best["epoch"] <= epoch):
        raise refuse("best.epoch", best["epoch"], f"an epoch from 0 to the checkpoint's {epoch}")
    if not (best["state"] is None or _is_tensors(best["state"])):
        raise refuse("best.state", best["state"], "None or a dict of tensors by name")


def _check_rng(rng: Any, refuse: Any) -> None:
    """torch's CPU generator state and NumPy's MT19937 state, as TaskTrainer._state saves them."""
    torch_state = torch.get_rng_state()
    if not (isinstance(rng, dict) and set(rng) == {"torch", "numpy"}):
        raise refuse("rng", rng, "{'torch': ..., 'numpy': ...}")
    saved = rng["torch"]
    if not (isinstance(saved, torch.Tensor) and saved.dtype == torch.uint8 and saved.shape == torch_state.shape):
        raise refuse("rng.torch", saved, f"torch's generator state (a uint8 tensor of {torch_state.numel()} bytes)")
    numpy_state = rng["numpy"]
    if not (isinstance(numpy_state, list) and len(numpy_state) == 4 and isinstance(numpy_state[0], torch.Tensor)
            and numpy_state[0].dtype == torch.int64 and numpy_state[0].shape == (MT_WORDS,)
            and bool(((numpy_state[0] >= 0) & (numpy_state[0] < 2**32)).all())
            and _is_int(numpy_state[1], 0) and numpy_state[1] <= MT_WORDS and numpy_state[2] in (0, 1)
            and not isinstance(numpy_state[2], float) and _is_number(numpy_state[3])):
        raise refuse("rng.numpy", numpy_state, f"NumPy's MT19937 state: [{MT_WORDS} words (int64 tensor), "
                     f"position 0..{MT_WORDS}, has_gauss 0 or 1, gauss]")


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


def check_store_in_place(store: Store, epochs_done: int) -> None:
    """The store's folder still holds the store this run opened (`store.fingerprint`, taken
    as the run started): one preprocessed again or replaced under a live run stops it before
    a checkpoint of an epoch that read from both is written (nothing is written to either)."""
    try:
        now = store.fingerprint_on_disk()
    except SmallFileError as exc:
        now = f"unreadable ({exc})"
    if now != store.fingerprint:
        raise StoreError(f"store: {store.path} was replaced while this run trained on it (manifest sha256 "
                         f"{store.fingerprint[:12]} when the run opened it, {shown(now[:300])} now): the run "
                         f"stopped; the checkpoint of epoch {epochs_done} (of the store it opened) is kept. "
                         "Train the new store in a new run_dir")


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
