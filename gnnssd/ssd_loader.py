"""`features: ssd`: mini-batches whose input features stream from the SSD.

Three stages overlap, each a thread with a bounded hand-off:
  plan   sample an epoch's mini-batches, group them into mega-batches, plan each one's
         reads (and repack compact blocks when a block budget is given);
  read   fill the next mega-batch buffer through the io_engine while the current one
         trains (two buffers: the one trained on, the one being filled);
  train  (the caller) gather each mini-batch's rows from [hot cache | buffer], build
         DGL blocks, run the model.
The hot cache holds the rows sampling reaches most often for the whole run.
"""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from gnnssd.sampler import (DirectIO, MegaBatchLoader, MegaBatchPlan, NeighborSampler, PlanConfig, Planner,
                            PlanWorker, hotness, load_model, remove, repacked_windows, to_dgl_blocks)
from gnnssd.sampler.repack import RepackReport
from gnnssd.sampler.readplan import pages_plan
from gnnssd.storage_format import Store

from .budget import MemoryBudget, format_bytes, parse_bytes
from .config import Config, ConfigError
from .memory_loader import Batch
from .timing import StageTimer

log = logging.getLogger("gnnssd.ssd")

MIN_STAGING, MAX_STAGING = 4 << 20, 32 << 20
PLANS_IN_FLIGHT_BYTES = 8 << 20  # plans and gathered batches queued between the stages
MINIBATCH_MARGIN = 1.5  # buffer rows per sampled mini-batch's input rows: batches vary


def staging_bytes(budget: int) -> int:
    """The page-read staging area (double-buffered chunks of extents): 1/16 of the budget,
    within [4, 32] MiB (it must hold two 1 MiB extents; more only batches reads larger)."""
    return min(MAX_STAGING, max(MIN_STAGING, budget // 16))


class IOCounters:
    """Bytes and requests the pipeline sent to the disk since the last `take`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.bytes_read = self.bytes_written = self.requests = 0

    def take(self) -> dict[str, int]:
        counts = {"bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                  "requests": self.requests}
        self.reset()
        return counts


class SSDLoader:
    def __init__(self, store: Store, config: Config, device: torch.device, timer: StageTimer,
                 block_dir: Path):
        ssd = config.ssd
        self.store, self.config, self.device, self.timer = store, config, device, timer
        self.io_counts = IOCounters()
        self.model = load_model(store.path)
        self.block_budget = parse_bytes(ssd.block_budget)
        self.block_dir = block_dir
        shutil.rmtree(block_dir, ignore_errors=True)  # blocks of an interrupted run are stale
        total = parse_bytes(ssd.memory_budget)
        row_bytes = store.row_bytes
        self.staging_bytes = staging_bytes(total)
        self.writer_bytes = self.staging_bytes // 4
        queue_bytes = self.staging_bytes + PLANS_IN_FLIGHT_BYTES
        if self.block_budget:
            # the repack scan's own staging area, the block writer's chunks, and the plan
            # stubs of two windows (their read rows: 8 bytes per row of a window's blocks)
            queue_bytes += (self.staging_bytes + self.writer_bytes
                            + 2 * (self.block_budget // 2 // row_bytes) * 8)
        usable = max(total - queue_bytes, 0)
        # Two buffers take (1 - hot_fraction) of what is left, or more when sampled
        # mini-batches (with a margin) need more; the hot cache gets the rest.
        needed = int(MINIBATCH_MARGIN * self._rows_per_minibatch())
        if 2 * needed * row_bytes > usable:
            least = 2 * needed * row_bytes + queue_bytes
            raise ConfigError(
                f"ssd.memory_budget: {format_bytes(total)} is too small: a mini-batch reads up to "
                f"~{needed:,} rows of {row_bytes} B (with margin), and two buffers of that plus "
                f"{format_bytes(queue_bytes)} of queues need at least {format_bytes(least)}; raise "
                "memory_budget or lower sampler.batch_size / fanouts (eval ones too)")
        buffer_rows = max(int(usable * (1 - ssd.hot_fraction)) // (2 * row_bytes), needed)
        try:
            self.budget = MemoryBudget.split(total, row_bytes, hot_rows=min(store.num_nodes, usable // row_bytes),
                                             buffer_rows=max(buffer_rows, 1), prefetch_depth=1,
                                             queue_bytes=queue_bytes)
        except ValueError as exc:
            raise ConfigError(f"ssd.memory_budget: {exc}") from None
        self.hot_rows = self._hot_rows(self.budget.hot_rows)
        log.info(self.budget.describe())
        self.io = DirectIO(queue_depth=ssd.queue_depth, backend=ssd.io_backend)
        log.info("features from %s through the %s backend; %s of hot rows loaded",
                 store.features_path, self.io.backend, format_bytes(len(self.hot_rows) * row_bytes))
        with timer.stage("read"):
            self.loader = MegaBatchLoader(self.io, store.features_path, store.feat_dim, store.feat_dtype,
                                          self.hot_rows, self.budget.buffer_rows, self.model,
                                          block_dir, staging_bytes=self.staging_bytes)
        self.io_counts.bytes_read += len(self.hot_rows) * row_bytes

    def _rows_per_minibatch(self) -> int:
        """Most input rows among a few sampled mini-batches, with the training and with the
        evaluation settings: what a buffer must hold at the least."""
        sampler_cfg = self.config.sampler
        layers = len(sampler_cfg.fanouts)
        settings = [(sampler_cfg.fanouts, sampler_cfg.batch_size),
                    (sampler_cfg.eval_fanouts or [-1] * layers, sampler_cfg.eval_batch_size)]
        rng = np.random.default_rng(self.config.seed)
        most = 0
        for fanouts, batch_size in settings:
            sampler = NeighborSampler(self.store.indptr, self.store.indices, fanouts)
            for nodes in (self.store.train_idx, self.store.valid_idx, self.store.test_idx):
                nodes = np.asarray(nodes)
                if len(nodes):
                    seeds = np.sort(rng.choice(nodes, min(len(nodes), batch_size), replace=False))
                    most = max(most, len(sampler.sample(seeds, self.config.seed).input_nodes))
        return most

    def _hot_rows(self, count: int) -> np.ndarray:
        """The `count` rows sampling reaches most; the front of the file when the store's
        order already put the hottest rows first (one sequential read)."""
        if count == 0:
            return np.empty(0, np.int64)
        if self.store.manifest["order"] in ("degree", "locality"):
            return np.arange(count, dtype=np.int64)
        heat = hotness(self.store.indptr, self.store.indices, self.config.sampler.fanouts,
                       np.asarray(self.store.train_idx))
        return np.sort(np.argsort(-heat, kind="stable")[:count]).astype(np.int64)

    def batches(self, nodes: np.ndarray, fanouts: list[int], batch_size: int, shuffle: bool,
                epoch: int = 0) -> Iterator[Batch]:
        """The mini-batches of `nodes` for one epoch (seeded by the config seed and `epoch`);
        with `shuffle` the planner permutes `nodes`, else takes them in order."""
        cfg = PlanConfig(batch_size=batch_size, fanouts=tuple(fanouts), mega_batch=self.config.ssd.mega_batch,
                         seed=self.config.seed, shuffle=shuffle)
        planner = Planner(self.store.indptr, self.store.indices, nodes, cfg, self.hot_rows,
                          max_rows=self.budget.buffer_rows)
        if self.block_budget:
            self.block_dir.mkdir(parents=True, exist_ok=True)
        plans = PlanWorker(self._planned(planner.plans([epoch])), depth=2)
        planned = PlanWorker(self._repacked_windows(iter(plans)), depth=2)
        loaded = PlanWorker(self._loaded(planned), depth=2)
        try:
            pending = iter(loaded)
            while True:
                start = time.perf_counter()
                item = next(pending, None)
                self.timer.add("wait", time.perf_counter() - start)
                if item is None:
                    return
                plan, buffer = item
                yield from self._minibatches(plan, buffer)
        finally:
            loaded.close()
            planned.close()
            plans.close()
            shutil.rmtree(self.block_dir, ignore_errors=True)

    def _planned(self, plans: Iterator[MegaBatchPlan]) -> Iterator[MegaBatchPlan]:
        """Plan stage: mega-batch plans with their page reads planned. With blocks, plans
        wait for their repack window as stubs, their mini-batches spilled to the block
        directory: memory then does not grow with the window."""
        for plan in _timed(plans, self.timer, "plan"):
            with self.timer.stage("plan"):
                plan.read = pages_plan(plan.read_rows, self.store.row_bytes, self.model)
                if self.block_budget:
                    plan = plan.spill(self.block_dir / f"plan_e{plan.epoch}_m{plan.index}.npz")
            yield plan

    def _repacked_windows(self, plans: Iterator[MegaBatchPlan]) -> Iterator[list[MegaBatchPlan]]:
        """Repack stage (its own thread, behind the planner's): windows of plans, compact
        blocks written for those the read planner gives one. Without a block budget, each
        plan is its own window with page reads."""
        if self.block_budget == 0:
            return ([plan] for plan in plans)
        return repacked_windows(plans, self.io, self.store.features_path, self.store.row_bytes, self.model,
                                self.block_budget, self.block_dir, self.staging_bytes, self.writer_bytes,
                                report=self._count_repack)

    def _count_repack(self, report: RepackReport) -> None:
        self.timer.add("repack", report.seconds)
        self.io_counts.bytes_read += report.bytes_read
        self.io_counts.requests += report.requests
        self.io_counts.bytes_written += report.bytes_written

    def _loaded(self, windows_: PlanWorker) -> Iterator[tuple[MegaBatchPlan, np.ndarray]]:
        """Read stage: each plan's buffer filled; block files deleted once read."""
        for window in windows_:
            for plan in window:
                with self.timer.stage("read"):
                    if plan.spill_path:
                        plan = plan.restore()
                    buffer = self.loader.load(plan)
                self.io_counts.bytes_read += plan.read.nbytes
                self.io_counts.requests += len(plan.read.offsets)
                remove([plan], self.block_dir)
                yield plan, buffer

    def _minibatches(self, plan: MegaBatchPlan, buffer: np.ndarray) -> Iterator[Batch]:
        for i, mfgs in enumerate(plan.minibatches):
            with self.timer.stage("gather"):
                x = torch.from_numpy(self.loader.gather(plan, i, buffer))
                if x.dtype != torch.float32:
                    x = x.float()
                blocks = to_dgl_blocks(mfgs)
            with self.timer.stage("transfer"):
                if self.device.type == "cuda":
                    x = x.pin_memory().to(self.device, non_blocking=True)
                    blocks = [b.to(self.device) for b in blocks]
            yield Batch(blocks, x, torch.from_numpy(mfgs.seeds))

    def close(self) -> None:
        self.loader.close()
        self.io.shutdown()


def _timed(items: Iterator, timer: StageTimer, stage: str) -> Iterator:
    """Charge the time spent producing each item of `items` to `stage`."""
    while True:
        start = time.perf_counter()
        item = next(items, None)
        timer.add(stage, time.perf_counter() - start)
        if item is None:
            return
        yield item
