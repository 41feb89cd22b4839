"""The Trainer: fit, evaluate and predict from a store, with checkpoints and resume."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from tqdm import tqdm

from gnnssd.storage_format import Store

from . import distributed
from .checkpoint import MetricsLog, load_checkpoint, save_checkpoint
from .config import Config, ConfigError, load_config
from .memory_loader import MemoryLoader
from .ssd_loader import SSDLoader
from .models import build_model
from .runtime import epoch_seed, seed_everything, select_device, use_single_thread
from .timing import StageTimer

log = logging.getLogger("gnnssd.trainer")

# Parts of the config a resumed run must share with the run that wrote the checkpoint.
RESUME_KEYS = ("store", "features", "seed", "deterministic", "model", "sampler")


class Trainer:
    """Trains one of the built-in models on a store, as a configuration describes.

    `fit()` runs the epochs (resuming from the run directory's checkpoint when asked),
    `evaluate()` scores a split, `predict()` labels nodes in their original IDs.
    """

    def __init__(self, config: Config | str | Path, overrides: dict[str, Any] | None = None):
        self.config = config if isinstance(config, Config) else load_config(config, overrides)
        cfg = self.config
        self.ranks = distributed.current()  # several when inside an initialised process group
        self.run_dir = cfg.run_path()
        self.store = Store.open(cfg.store_path())
        distributed.check_same_store(self.store, self.ranks)
        if self.store.num_classes < 2:
            raise ConfigError(f"store {cfg.store}: {self.store.num_classes} classes; need >= 2")
        self.device = distributed.rank_device(select_device(cfg.device), self.ranks)
        if cfg.deterministic:
            use_single_thread()
        seed_everything(cfg.seed)
        self.timer = StageTimer()
        self.loader = self._make_loader()
        self.labels = torch.from_numpy(np.array(self.store.labels, dtype=np.int64))
        self.model = build_model(cfg.model, self.store.feat_dim, self.store.num_classes).to(self.device)
        self.train_model = distributed.wrap(self.model, self.ranks, self.device)
        self.progress = distributed.progress(self.ranks)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.epochs_done = 0
        self.best: dict[str, Any] = {"valid_acc": -1.0, "epoch": 0, "state": None}
        self.metrics = MetricsLog(self.run_dir)

    def _make_loader(self) -> MemoryLoader | SSDLoader:
        if self.config.features == "ssd":
            blocks = self.run_dir / ("blocks" if not self.ranks.active else f"blocks_rank{self.ranks.rank}")
            try:
                return SSDLoader(self.store, distributed.share_budget(self.config, self.ranks), self.device,
                                 self.timer, blocks)
            except ConfigError as exc:
                if self.ranks.local_world_size == 1:
                    raise
                raise ConfigError(f"{exc} (ssd.memory_budget is the machine's total, split between "
                                  f"its {self.ranks.local_world_size} local ranks)") from None
        return MemoryLoader(self.store, self.device, self.timer)

    def close(self) -> None:
        """Release the loader's files, buffers and I/O threads."""
        self.loader.close()

    # --- training ----------------------------------------------------------------------

    def fit(self, resume: bool = False) -> list[dict[str, Any]]:
        """Train for `train.epochs` epochs; returns the per-epoch metrics of this call.

        In a process group every rank calls it; rank 0 alone writes the run directory."""
        try:
            return self._fit(resume)
        except RuntimeError as exc:
            named = self.progress.failure(exc) if self.ranks.active else None
            if named is None:
                raise
            raise named from exc  # a failed collective: the ranks that stopped are named

    def _fit(self, resume: bool) -> list[dict[str, Any]]:
        cfg = self.config
        main = self.ranks.is_main
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = distributed.from_rank0(lambda: load_checkpoint(self.run_dir), self.ranks)
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
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        history = []
        for epoch in range(self.epochs_done + 1, cfg.train.epochs + 1):
            record = self._train_epoch(epoch)
            if epoch % cfg.train.eval_every == 0 or epoch == cfg.train.epochs:
                record.update(self._evaluate_epoch(epoch))
            self.epochs_done = epoch
            if main:
                self.metrics.append(record)
                save_checkpoint(self.run_dir, self._state())
                log.info(_format_record(record, cfg.train.epochs))
            history.append(record)
        if self.best["state"] is not None:
            self.model.load_state_dict(self.best["state"])
        return history

    def _train_epoch(self, epoch: int) -> dict[str, Any]:
        cfg = self.config
        seed_everything(epoch_seed(cfg.seed, epoch) + self.ranks.rank)  # ranks draw apart
        self.model.train()
        start = time.perf_counter()
        self.timer.take()
        if isinstance(self.loader, SSDLoader):
            self.loader.io_counts.reset()
        loss_sum, correct, seen = 0.0, 0, 0
        seeds, shuffle = self.ranks.epoch_seeds(self.store.train_idx, cfg.seed, epoch)
        n_batches = -(-len(seeds) // cfg.sampler.batch_size)
        batches = self.loader.batches(seeds, cfg.sampler.fanouts, cfg.sampler.batch_size,
                                      shuffle=shuffle, epoch=epoch)
        for batch in tqdm(batches, total=n_batches, desc=f"epoch {epoch}", leave=False,
                          disable=not (cfg.train.progress and self.ranks.is_main), mininterval=1.0):
            with self.timer.stage("compute"):
                y = self.labels[batch.output_nodes].to(self.device)
                logits = self.train_model(batch.blocks, batch.x)
                loss = F.cross_entropy(logits, y)
                self.optimizer.zero_grad()
                self.progress.enter()  # backward averages the gradients over the ranks
                loss.backward()
                self.optimizer.step()
            loss_sum += loss.item() * len(y)
            correct += int((logits.argmax(1) == y).sum())
            seen += len(y)
        self.progress.enter()
        loss_sum, correct, seen = distributed.sum_over_ranks([loss_sum, correct, seen], self.ranks)
        record = {"epoch": epoch, "train_loss": loss_sum / seen, "train_acc": correct / seen,
                  "epoch_s": round(time.perf_counter() - start, 4), "stages_s": self.timer.take(),
                  "batches": n_batches}
        if isinstance(self.loader, SSDLoader):
            record["io"] = self.loader.io_counts.take()
        return record

    def _evaluate_epoch(self, epoch: int) -> dict[str, Any]:
        scores = {f"{split}_acc": self.evaluate(split)["accuracy"] for split in ("valid", "test")}
        if scores["valid_acc"] > self.best["valid_acc"]:
            self.best = {"valid_acc": scores["valid_acc"], "test_acc": scores["test_acc"],
                         "epoch": epoch,
                         "state": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}}
        return {**scores, "best_epoch": self.best["epoch"], "best_test_acc": self.best["test_acc"]}

    # --- evaluation and prediction --------------------------------------------------------

    @torch.no_grad()
    def _logits(self, nodes: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of `nodes` (store IDs) with the evaluation fanouts, in batch order."""
        cfg = self.config
        fanouts = cfg.sampler.eval_fanouts or [-1] * cfg.model.layers
        self.model.eval()
        outputs, order = [], []
        for batch in self.loader.batches(nodes, fanouts, cfg.sampler.eval_batch_size, shuffle=False):
            outputs.append(self.model(batch.blocks, batch.x).cpu())
            order.append(batch.output_nodes)
        if not outputs:
            return torch.empty(0, self.store.num_classes), torch.empty(0, dtype=torch.long)
        return torch.cat(outputs), torch.cat(order)

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Accuracy and loss of the current model on 'train', 'valid' or 'test' (each rank
        scores its share of the nodes; the sums are added over the ranks)."""
        logits, nodes = self._logits(self.ranks.split(self.store.split(split)))
        y = self.labels[nodes]
        local = [float((logits.argmax(1) == y).sum()),
                 float(F.cross_entropy(logits, y, reduction="sum")), float(len(nodes))]
        self.progress.enter()
        correct, loss_sum, count = distributed.sum_over_ranks(local, self.ranks)
        if count == 0:
            return {"accuracy": float("nan"), "loss": float("nan"), "nodes": 0}
        return {"accuracy": correct / count, "loss": loss_sum / count, "nodes": int(count)}

    def predict(self, original_ids: np.ndarray | None = None) -> np.ndarray:
        """Predicted class of each node, indexed by original node ID (all nodes by default)."""
        if original_ids is None:
            original_ids = np.arange(self.store.num_nodes)
        original_ids = np.asarray(original_ids, dtype=np.int64)
        bad = original_ids[(original_ids < 0) | (original_ids >= self.store.num_nodes)]
        if bad.size:
            raise ValueError(f"node ID {bad[0]} outside 0..{self.store.num_nodes - 1}")
        store_ids = np.asarray(self.store.inv)[original_ids]
        logits, nodes = self._logits(self.ranks.split(store_ids))
        nodes, classes = distributed.gather_arrays((nodes.numpy(), logits.argmax(1).numpy()), self.ranks)
        by_store_id = np.empty(self.store.num_nodes, dtype=np.int64)
        by_store_id[nodes] = classes
        return by_store_id[store_ids]

    def load_best(self) -> None:
        """Load the checkpoint's best-validation weights (for eval/predict after fit)."""
        checkpoint = distributed.from_rank0(lambda: load_checkpoint(self.run_dir), self.ranks)
        if checkpoint is None:
            raise RuntimeError(f"{self.run_dir}: no checkpoint; train first")
        self._restore(checkpoint)
        if self.best["state"] is not None:
            self.model.load_state_dict(self.best["state"])

    # --- checkpoint state ----------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {"epoch": self.epochs_done, "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "best": self.best,
                "config": self.config.to_dict(), "world_size": self.ranks.world_size,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}}

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        saved, current = checkpoint["config"], self.config.to_dict()
        for key in RESUME_KEYS:
            if saved[key] != current[key]:
                raise ConfigError(f"{key}: the checkpoint in {self.run_dir} was trained with "
                                  f"{saved[key]!r}, the config says {current[key]!r}")
        distributed.check_world_size(checkpoint, self.ranks, self.run_dir)
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.epochs_done = checkpoint["epoch"]
        self.best = checkpoint["best"]
        torch.set_rng_state(checkpoint["rng"]["torch"])
        np.random.set_state(checkpoint["rng"]["numpy"])


def _format_record(r: dict[str, Any], epochs: int) -> str:
    parts = [f"epoch {r['epoch']}/{epochs}", f"loss {r['train_loss']:.4f}", f"train {r['train_acc']:.4f}"]
    if "valid_acc" in r:
        parts += [f"valid {r['valid_acc']:.4f}", f"test {r['test_acc']:.4f}"]
    stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages_s"].items())
    parts.append(f"{r['epoch_s']:.2f} s ({stages})")
    return "  ".join(parts)
