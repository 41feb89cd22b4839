"""What every task's trainer shares (TaskTrainer): the run directory, its lock and
checkpoints, resume, the feature source, the epoch loop and the choice of the best model.
A task (gnnssd.training.node_task, gnnssd.training.link) adds its store checks, model, loss and evaluation;
`gnnssd.Trainer(config)` (gnnssd.training.tasks) builds the config's."""
from __future__ import annotations

import abc
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import psutil
import torch
import yaml
from tqdm import tqdm

from gnnssd.core import (Config, ConfigError, ModelConfig, SamplerConfig, as_config, current, epoch_seed, format_bytes,
                         seed_everything, select_device, uninterruptible, use_single_thread)
from gnnssd.loading import FeatureSource, backend_class, typed_form
from gnnssd.models import device_for, store_model
from gnnssd.storage_format import Store, shown

from . import distributed
from .checkpoint import (CHECKPOINT, CheckpointError, MetricsLog, check_store, check_store_in_place, load_checkpoint,
                         save_checkpoint)
from .rundir import RunLock, Scratch, prepare_run_dir, write_run_file

log = logging.getLogger("gnnssd.training.trainer")

# Parts of the config a resumed run must share with the run that wrote the checkpoint.
RESUME_KEYS = ("store", "features", "seed", "deterministic", "task", "model", "sampler")
#: The run's own copy of its configuration (never the user's config.yaml beside it).
RUN_CONFIG = "run_config.yaml"
#: Bytes per parameter while training: weights, gradients and Adam's two moments (float32).
TRAINING_BYTES_PER_PARAMETER = 16


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the checkpoint is left as it was."""


class TaskTrainer(abc.ABC):
    """Trains a model on a store, as a configuration describes: one of the built-in models,
    or the user's `model` (any module taking `(blocks, x)`).

    `fit()` runs the epochs (resuming from the run directory's checkpoint when asked),
    `evaluate()` scores a split, `load_best()` takes the best checkpoint back. A task
    implements the abstract methods; `gnnssd.Trainer(config)` builds the config's task.

    Inside an initialised torch.distributed process group every rank builds its own
    trainer: each loads its shard of the seeds, DDP averages the gradients, evaluation is
    split between the ranks, and rank 0 alone locks and writes the run directory.
    """

    SELECTION: ClassVar[str]  # the validation score that picks the best model
    SELECTION_NAME: ClassVar[str]  # ... as the CLI prints it
    ENCODER_PREFIX: ClassVar[str]  # the checkpoint keys of the model that embeds nodes (layer-wise)
    CLASSIFIES: ClassVar[bool]  # the task labels nodes: train_acc, predict

    def __init__(self, config: Config | str | Path, overrides: dict[str, Any] | None = None,
                 model: torch.nn.Module | None = None):
        self.config = as_config(config, overrides)
        cfg = self.config
        self.ranks = current()  # several when inside an initialised process group
        self.run_dir = cfg.run_path()
        self.store = Store.open(cfg.store_path())
        self.store.fingerprint  # taken now: the store's identity checked between epochs (check_store_in_place)
        distributed.check_same_config(cfg, self.ranks)
        distributed.check_same_store(self.store, self.ranks)
        self._check_store()
        _check_memory(distributed.share_budget(cfg, self.ranks), self.store, self._output_dim())
        if cfg.deterministic:
            use_single_thread()
        seed_everything(cfg.seed)
        built = self._build_model(model)
        self.device = distributed.rank_device(device_for(built, select_device(cfg.device), cfg.device,
                                                         csc_blocks=cfg.features == "device"), self.ranks)
        self.scratch = Scratch(self.run_dir)  # each rank its own
        self.lock: RunLock | None = None
        self.source = self._open_source()
        try:
            self.loader = self._make_loader()
        except BaseException:
            self.source.close()
            raise
        self.model = built.to(self.device)
        self.train_model = distributed.wrap(self.model, self.ranks, self.device, self._unused_parameters())
        self.progress = distributed.progress(self.ranks)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.epochs_done = 0
        self.best: dict[str, Any] = {f"valid_{self.SELECTION}": -1.0, f"test_{self.SELECTION}": None, "epoch": 0,
                                     "state": None}
        self.metrics = MetricsLog(self.run_dir)

    # --- what a task implements (gnnssd.training.node_task, gnnssd.training.link) ------------------------

    @abc.abstractmethod
    def _check_store(self) -> None:
        """Refuse a store the task cannot train on, naming what it lacks."""

    @abc.abstractmethod
    def _split_size(self, split: str) -> int:
        """How many examples (nodes, edges) `split` evaluates."""

    @classmethod
    @abc.abstractmethod
    def output_dim(cls, config: Config, store: Store) -> int:
        """The width of the built-in model's output."""

    @abc.abstractmethod
    def _make_loader(self) -> Any:
        """The training loader over `self.source` (a rank loads its shard)."""

    @abc.abstractmethod
    def _batch_loss(self, batch: Any) -> tuple[torch.Tensor, int | torch.Tensor, int | torch.Tensor | None]:
        """The training step's loss on one mini-batch, the examples it averages over and
        how many of them the model got right (None: the task has no accuracy)."""

    @abc.abstractmethod
    def _split_scores(self, split: str) -> dict[str, float]:
        """The scores of one evaluation split, by name (metrics.jsonl prefixes the split)."""

    @abc.abstractmethod
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """The task's metrics on `split`."""

    def _unused_parameters(self) -> bool:
        """Whether a training step may leave some of the model's parameters without a
        gradient (data-parallel training must then look for them every step): on a
        heterogeneous store, the relations into a type a mini-batch's layer has no node of
        (the last layer's non-target types, the other types of a link task's relation)."""
        return typed_form(self.store.schema)

    def _output_dim(self) -> int:
        return self.output_dim(self.config, self.store)

    def _seeds_per_batch(self) -> int:
        """The most seeds a training mini-batch has (what the ssd buffers are sized for)."""
        return self.config.sampler.batch_size

    def _build_model(self, model: torch.nn.Module | None) -> torch.nn.Module:
        return model if model is not None else store_model(self.config.model, self.store, self._output_dim())

    def _open_source(self) -> FeatureSource:
        """The store's features, shared by the training loader and evaluation: a rank's
        within its share of the machine's `ssd.memory_budget`."""
        cfg = self.config
        sampling = SamplerConfig(fanouts=cfg.sampler.fanouts, batch_size=self._seeds_per_batch(),
                                 eval_fanouts=cfg.sampler.eval_fanouts, eval_batch_size=cfg.sampler.eval_batch_size,
                                 method=cfg.sampler.method)
        try:
            return FeatureSource(self.store, cfg.features, distributed.share_budget(cfg, self.ranks).ssd, sampling,
                                 seed=cfg.seed, device=self.device, scratch_dir=self.scratch.path)
        except ConfigError as exc:
            if self.ranks.local_world_size == 1:
                raise
            raise ConfigError(f"{exc} (ssd.memory_budget is the machine's total, split between "
                              f"its {self.ranks.local_world_size} local ranks)") from None

    def close(self) -> None:
        """Release the loader's files, buffers and I/O threads, this process's scratch
        directory and the run directory's lock."""
        self.source.close()
        self.scratch.remove()
        self._unlock()

    def _unlock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # --- training ----------------------------------------------------------------------

    def fit(self, resume: bool = False) -> list[dict[str, Any]]:
        """Train for `train.epochs` epochs; returns the per-epoch metrics of this call.

        In a process group every rank calls it; rank 0 alone locks and writes the run
        directory, and a failed collective names the ranks that stopped."""
        try:
            # rank 0 clears stale scratch before any rank writes its own; its error fails all
            distributed.from_rank0(self._lock_for_writing, self.ranks)
            try:
                return self._fit(resume)
            except RuntimeError as exc:
                named = self.progress.failure(exc) if self.ranks.active else None
                if named is None:
                    raise
                raise named from exc
        finally:
            self._unlock()

    def _lock_for_writing(self) -> None:
        prepare_run_dir(self.run_dir, create=True)
        self._unlock()  # a reader's lock of our own (after load_best) gives way to the writer's
        self.lock = RunLock(self.run_dir, exclusive=True)
        self.scratch.clear_stale()
        # made here, under the lock, not by the first folder a stream needs (with packers,
        # a short stream needs none): a run's own scratch says its training has begun
        self.scratch.path.mkdir(parents=True, exist_ok=True)

    def _fit(self, resume: bool) -> list[dict[str, Any]]:
        cfg = self.config
        main = self.ranks.is_main
        checkpoint = distributed.from_rank0(lambda: load_checkpoint(self.run_dir, model=self.model), self.ranks)
        if checkpoint is not None and not resume:
            raise RuntimeError(f"{self.run_dir}: holds a checkpoint of epoch {checkpoint['epoch']}; "
                               "pass --resume (resume=True) to continue it, or pick another run_dir")
        if checkpoint is not None:
            self._restore(checkpoint)
            log.info("resumed from %s at epoch %d", self.run_dir, self.epochs_done)
        elif resume:
            log.info("no checkpoint in %s: starting afresh", self.run_dir)
        if main:
            self.metrics.truncate_after(self.epochs_done)
            write_run_file(self.run_dir / RUN_CONFIG, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        for split in ("valid", "test"):
            if self._split_size(split) == 0:
                log.info("the %s split of %s is empty: its evaluation is skipped", split, cfg.store)
        history = []
        for epoch in range(self.epochs_done + 1, cfg.train.epochs + 1):
            self._check_store_unchanged()
            record = self._train_epoch(epoch)
            if epoch % cfg.train.eval_every == 0 or epoch == cfg.train.epochs:
                record.update(self._evaluate_epoch(epoch))
            self._check_store_unchanged()
            self.epochs_done = epoch
            if main:
                self.metrics.append(record)
                save_checkpoint(self.run_dir, self._state())
                log.info(self._format_record(record))
            history.append(record)
        if self.best["state"] is not None:
            self.model.load_state_dict(self.best["state"])
        return history

    def _check_store_unchanged(self) -> None:
        """Rank 0 checks that the store was not rewritten under the run; a collective of
        the training loop, counted like a step's."""
        self.progress.enter()
        distributed.from_rank0(lambda: check_store_in_place(self.store, self.epochs_done), self.ranks,
                               training=True)

    def _train_epoch(self, epoch: int) -> dict[str, Any]:
        """One epoch over the loader, a `_batch_loss` step per mini-batch."""
        cfg = self.config
        seed_everything(epoch_seed(cfg.seed, epoch) + self.ranks.rank)  # ranks draw apart (dropout)
        self.model.train()
        start = time.perf_counter()
        self.loader.stage_times()
        self.loader.io_stats()
        # Sums kept where the loss lives: a GPU step is not waited for on the host, so the
        # next mini-batch is loaded (and copied) while it computes. On a GPU a loss is checked
        # once the next step is queued (its mini-batch still named); on the CPU at once.
        sums = [torch.zeros((), dtype=torch.float64, device=self.device) for _ in range(3)]
        unchecked: tuple[torch.Tensor, int] | None = None
        self.loader.set_epoch(epoch)
        n_batches = min(len(self.loader), cfg.train.max_batches or len(self.loader))
        stop_at = n_batches if n_batches < len(self.loader) else None  # a whole epoch runs its iterator out
        batches = iter(self.loader)
        progress = tqdm(total=n_batches, desc=f"epoch {epoch}", leave=False,
                        disable=not (cfg.train.progress and self.ranks.is_main), mininterval=1.0)
        i = 0
        try:  # closed here, not when collected: an error or Ctrl-C stops the I/O threads now
            # a plain loop whose mini-batch is dropped before the next is made (enumerate's
            # and tqdm's iterators would hold it): one mini-batch's x in memory, not two
            for batch in batches:
                i += 1
                with self.loader.timer.stage("compute"), uninterruptible():
                    loss, count, right = self._batch_loss(batch)
                    if self.device.type == "cpu":
                        self._check_finite(loss, i, epoch, n_batches)
                    self.optimizer.zero_grad()
                    self.progress.enter()  # backward averages the gradients over the ranks
                    loss.backward()
                    self.optimizer.step()
                    if unchecked is not None:
                        self._check_finite(*unchecked, epoch, n_batches)
                    unchecked = (loss.detach(), i) if self.device.type != "cpu" else None
                for total, value in zip(sums, (loss.detach() * count, 0 if right is None else right, count)):
                    total += value
                progress.update()
                del batch, loss
                if i == stop_at:  # train.max_batches: the rest of the epoch is not loaded
                    break
            if unchecked is not None:
                self._check_finite(*unchecked, epoch, n_batches)
        finally:
            progress.close()
            batches.close()
        self.progress.enter()
        loss_sum, correct, seen = distributed.sum_over_ranks([float(total) for total in sums], self.ranks)
        record: dict[str, Any] = {"epoch": epoch, "train_loss": loss_sum / max(seen, 1)}
        if self.CLASSIFIES:
            record["train_acc"] = correct / max(seen, 1)
        record.update({"epoch_s": round(time.perf_counter() - start, 4), "stages_s": self.loader.stage_times(),
                       "batches": i})
        if self.source.out_of_core:
            record["io"] = self.loader.io_stats()
        return record

    def _check_finite(self, loss: torch.Tensor, i: int, epoch: int, n_batches: int) -> None:
        if not math.isfinite(loss.item()):
            raise TrainingError(
                f"epoch {epoch}, mini-batch {i}/{n_batches}: the loss is {loss.item()}; "
                f"training stopped (the checkpoint of epoch {self.epochs_done} is kept). "
                f"Corrupt features or labels do this: run `gnnssd verify {self.config.store_path()}`; "
                "if the store is sound, lower train.lr")

    def _evaluate_epoch(self, epoch: int) -> dict[str, Any]:
        """Scores of the non-empty evaluation splits; the best model is the one of highest
        validation SELECTION score, or the latest when the store has no validation split."""
        key = self.SELECTION
        splits = [s for s in ("valid", "test") if self._split_size(s)]
        scores: dict[str, Any] = {f"{s}_{name}": value for s in splits
                                  for name, value in self._split_scores(s).items()}
        valid = scores.get(f"valid_{key}")
        if valid is None or valid > self.best[f"valid_{key}"]:
            self.best = {f"valid_{key}": -1.0 if valid is None else valid, f"test_{key}": scores.get(f"test_{key}"),
                         "epoch": epoch,
                         "state": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}}
        skipped = [s for s in ("valid", "test") if s not in splits]
        if skipped:
            scores["skipped_splits"] = skipped
        return {**scores, "best_epoch": self.best["epoch"], f"best_test_{key}": self.best[f"test_{key}"]}

    # --- the best model ------------------------------------------------------------------

    def load_best(self) -> None:
        """Load the checkpoint's best-validation weights (for eval/predict after fit).
        Takes the run directory's shared lock, held until `close()`: no training starts
        in it meanwhile."""
        prepare_run_dir(self.run_dir, create=False)
        if self.lock is None:
            self.lock = RunLock(self.run_dir, exclusive=False)
        checkpoint = distributed.from_rank0(lambda: load_checkpoint(self.run_dir, model=self.model), self.ranks)
        if checkpoint is None:
            raise RuntimeError(f"{self.run_dir}: no checkpoint; train first")
        self._restore(checkpoint)
        if self.best["state"] is not None:
            self.model.load_state_dict(self.best["state"])

    def _format_record(self, r: dict[str, Any]) -> str:
        """One epoch's log line: loss, the task's scores, time by stage."""
        parts = [f"epoch {r['epoch']}/{self.config.train.epochs}", f"loss {r['train_loss']:.4f}"]
        for split in ("train", "valid", "test"):
            key = f"{split}_{self.SELECTION}"
            if key in r:
                parts.append(f"{split} {self.SELECTION_NAME} {r[key]:.4f}")
        stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages_s"].items())
        parts.append(f"{r['epoch_s']:.2f} s ({stages})")
        return "  ".join(parts)


    # --- checkpoint state ----------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        """Tensors and plain values only: what a state file (`state_file`) holds."""
        _, keys, pos, has_gauss, gauss = np.random.get_state()
        return {"epoch": self.epochs_done, "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "best": self.best,
                "config": json.dumps(self.config.to_dict()), "store": self.store.fingerprint,
                "world_size": self.ranks.world_size,
                "rng": {"torch": torch.get_rng_state(),
                        "numpy": [torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                                  float(gauss)]}}

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        path = self.run_dir / CHECKPOINT  # its tree's shape is checked as it loads (check_run_state)
        saved = json.loads(checkpoint["config"])
        keys, pos, has_gauss, gauss = checkpoint["rng"]["numpy"]
        check_store(checkpoint, self.store, self.run_dir)
        current = self.config.to_dict()
        defaults = Config(store="", run_dir="").to_dict()
        for key in RESUME_KEYS:
            if isinstance(saved.get(key), dict):  # a key added since the checkpoint: its default
                saved[key] = {**defaults[key], **saved[key]}
            if saved.get(key) != current[key]:
                raise ConfigError(f"{key}: the checkpoint in {self.run_dir} was trained with "
                                  f"{shown(saved.get(key))}, the config says {current[key]!r}")
        distributed.check_world_size(checkpoint, self.ranks, self.run_dir)
        _check_epoch(checkpoint, saved, path)
        best = checkpoint["best"]
        if f"valid_{self.SELECTION}" not in best:
            raise CheckpointError(f"{path}: key 'best' holds {sorted(best)}; this task selects its best "
                                  f"model by valid_{self.SELECTION}")
        key = "best"
        try:
            if best["state"] is not None:
                _check_fits(best["state"], self.model)
            key = "model"
            _check_fits(checkpoint["model"], self.model)
            self.model.load_state_dict(checkpoint["model"])
            key = "optimizer"
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            _check_optimizer_shapes(self.optimizer)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise CheckpointError(f"{path}: key {key!r} does not fit this run's model "
                                  f"({str(exc).splitlines()[0][:300]})") from None
        self.epochs_done = checkpoint["epoch"]
        self.best = best
        torch.set_rng_state(checkpoint["rng"]["torch"])
        np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def _check_epoch(checkpoint: dict[str, Any], saved: dict[str, Any], path: Path) -> None:
    """The checkpoint's epoch is one the run that wrote it could reach (0..its train.epochs)."""
    train = saved.get("train")
    epoch, planned = checkpoint.get("epoch"), train.get("epochs") if isinstance(train, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0 or (
            isinstance(planned, int) and epoch > planned):
        raise CheckpointError(f"{path}: key 'epoch' is {shown(epoch, 60)}, expected an integer from 0 to "
                              f"the {shown(planned, 60)} epochs of the run that wrote it")


def _check_fits(state: Any, model: torch.nn.Module) -> None:
    """`state` holds exactly the model's tensors, of its shapes (load_state_dict would
    accept a tensor of another shape in some cases, or miss a key under strict=False)."""
    expected = model.state_dict()
    if not isinstance(state, dict):
        raise TypeError(f"a {type(state).__name__}, expected a dict of tensors")
    if set(state) != set(expected):
        raise KeyError(f"tensors {sorted(set(state) ^ set(expected))[:5]} differ from the model's")
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor) or tensor.shape != expected[name].shape:
            raise ValueError(f"{name}: {getattr(tensor, 'shape', type(tensor).__name__)}, the model has "
                             f"{tuple(expected[name].shape)}")


def _check_optimizer_shapes(optimizer: torch.optim.Optimizer) -> None:
    """Each loaded per-parameter state tensor (Adam's moments) has its parameter's shape:
    load_state_dict checks only the counts, and a wrong shape would fail at the first step."""
    for param, state in optimizer.state.items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and value.ndim and value.shape != param.shape:
                raise ValueError(f"{name} of shape {tuple(value.shape)} for a parameter of shape "
                                 f"{tuple(param.shape)}")


def _check_memory(cfg: Config, store: Store, output_dim: int) -> None:
    """Refuse a model or an ssd budget that cannot fit in the memory available now."""
    available = psutil.virtual_memory().available
    params = _parameters(cfg.model, store, output_dim)
    need = params * TRAINING_BYTES_PER_PARAMETER
    if need > available:
        # GAT's widths grow with its heads too: blame them when one head would fit
        single_head = dataclasses.replace(cfg.model, heads=1)
        no_tables = dataclasses.replace(cfg.model, featureless="zeros")
        if cfg.model.name in ("gat", "rgat") and cfg.model.heads > 1 and \
                _parameters(single_head, store, output_dim) * TRAINING_BYTES_PER_PARAMETER <= available:
            key = f"model.heads: {cfg.model.heads} (model.hidden {cfg.model.hidden})"
        elif cfg.model.featureless == "embedding" and \
                _parameters(no_tables, store, output_dim) * TRAINING_BYTES_PER_PARAMETER <= available:
            key = "model.featureless: embedding (a learned row per node of the featureless types; " \
                  "`featureless: zeros` holds none)"
        else:
            key = f"model.hidden: {cfg.model.hidden}"
        size = (f"{params:,} parameters, ~{format_bytes(need)} with gradients and Adam state"
                if math.isfinite(params) else "more parameters than torch can size")
        raise ConfigError(f"{key} gives {size}; available memory is {format_bytes(available)}")
    budget = cfg.ssd.memory_budget
    if backend_class(cfg.features).MEMORY_BUDGET and budget > available:
        raise ConfigError(f"ssd.memory_budget: {format_bytes(budget)} is more than the available "
                          f"memory ({format_bytes(available)})")


def _parameters(model: ModelConfig, store: Store, output_dim: int) -> int | float:
    """How many parameters the model of `model` has (inf past what torch can size),
    embedding tables of featureless node types included."""
    try:
        with torch.device("meta"):  # shapes only: nothing allocated
            return sum(p.numel() for p in store_model(model, store, output_dim).parameters())
    except RuntimeError:  # "Storage size calculation overflowed"
        return math.inf
