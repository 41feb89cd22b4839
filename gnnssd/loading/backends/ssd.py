"""`features: ssd`: mini-batches whose input features stream from the SSD.

Four stages overlap, three threads with bounded hand-offs and the caller:
  plan    sample the given seed batches, group them into mega-batches, plan each one's
          reads;
  repack  (with a block budget) write compact blocks for a window of plans;
With `ssd.packers`, plan (and repack, with a block budget) run in packer processes instead
(gnnssd.pipeline.packers), a window of mini-batches each, and the trainer's process only
reads, verifies and gathers; the first window (a few mini-batches) is planned here with page
reads, so the first mini-batch does not wait for a packer to start and repack. The packers
live as long as the loader: every stream after the first finds them running.
  read    fill the next mega-batch buffer through the io_engine while the current one
          trains (pipeline.buffers.BUFFERS buffers: the one trained on, the one being
          filled);
  caller  gather each mini-batch's rows from [device slice | hot cache | buffer] where
          HotCache.places says (on the host, or on the consuming device: ssd.gather),
          build DGL blocks.
The hot cache (pipeline.hot_cache) holds the rows sampling reaches most often for the
whole run, its hottest slice on the loader's device with ssd.device_budget; the planner
consults its membership, the gather its rows.
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from gnnssd.core import (AUTO_FEATURE_SHARE, PACKED_FEATURE_SHARE, ConfigError, SamplerConfig, SSDConfig, StageTimer,
                         disk_share, format_bytes, resolve_block_budget, ssd_split)
from gnnssd.pipeline import (BUFFERS, FIRST_WINDOW, OWN_WINDOW_MOST, SCANS_AT_ONCE, DirectIO, FeatureFile,
                             HotCache, HotRanking, KeptSamples, MegaBatchBuffers, PackerPool, PackerSpec, PlanWorker,
                             Recycler, RepackReport, check_numba_threads, default_packers, delete, describe_model,
                             load_cost_model, numba_threads, repacked_windows, samples_key, window_bounds, x_dtype,
                             x_pool_bytes)
from gnnssd.sampler import (Fanouts, HotRows, MegaBatchPlan, MFGs, NeighborSampler, PlanConfig, Planner, Strategy,
                            pages_plan, sampling_method)
from gnnssd.storage_format import Store

from .device import device_memory
from ..form import batch_parts
from ..tensor_sampling import TensorSampler
from ..typed import sampler_options
from ..types import IOCounters, Labels, MiniBatch, store_shared

log = logging.getLogger("gnnssd.ssd")

MIN_STAGING, MAX_STAGING = 4 << 20, 32 << 20
#: Plans in flight (their mini-batches' blocks and gather indices, from the planner to the
#: caller) take 1/PLAN_SHARE of ssd.memory_budget (see queue_sizing_budget), at least
#: MIN_PLAN_BYTES: counted in the budget, and bounded by bytes (see plan_bytes_in_flight).
PLAN_SHARE, MIN_PLAN_BYTES = 8, 8 << 20
#: Whole plans alive at once: the planner's (the one it fills and the mini-batches it
#: sampled ahead of it), the one the caller gathers from and the one loaded next (a plan
#: waiting for a repack window or kept for a replay waits spilled to disk, as a stub).
#: Each plan gets 1/PLANS_ALIVE of the bytes.
PLANS_ALIVE = 2 + BUFFERS
#: Mini-batches of a packer's window of page reads (no block budget): its plans carry rows
#: from one to the next, as the trainer's do (a window's first plan carries nothing).
PAGE_WINDOW = 4
#: The seed of the few mini-batches the buffers and x arrays are sized for (SSDLoader._sampled_inputs).
SIZING_SEED = 0


def plan_bytes_in_flight(budget: int) -> int:
    """The bytes plans in flight may hold (within the budget); each plan is cut to hold at
    most 1/PLANS_ALIVE of them (sampler.Planner's max_bytes: a single mini-batch may
    pass that)."""
    return max(MIN_PLAN_BYTES, budget // PLAN_SHARE)


def queue_sizing_budget(total: int, x_bytes: int) -> int:
    """The budget the staging and the plans in flight are sized from: all of it, or twice
    the memory beside the x arrays where they take more than half of it. Sized from the
    total, a budget that is mostly x arrays left the buffers 1 MiB each (a mini-batch read
    in ~150 pieces); sized from the memory beside them, papers' plans' share, which runs
    below its count, shrank and the resident parts grew past issue 35's 1.5 GiB (7226cbd)."""
    return min(total, 2 * max(total - x_bytes, 0))


def staging_bytes(budget: int) -> int:
    """The page-read staging area (double-buffered chunks of extents): 1/16 of the budget,
    within [4, 32] MiB (it must hold two 1 MiB extents; more only batches reads larger)."""
    return min(MAX_STAGING, max(MIN_STAGING, budget // 16))


class SSDLoader:
    """The out-of-core loader (the loader protocol of memory_loader): its memory is
    `ssd.memory_budget`, the x arrays it hands out included; buffers and x arrays are
    sized for the largest mini-batch of `sampling`'s training and evaluation settings;
    compact blocks go to `block_dir`."""

    #: What this backend can do (gnnssd.loading.feature_source.FeatureBackend): everything.
    OUT_OF_CORE = True
    MEMORY_BUDGET = True
    SCRATCH = True
    EDGE_BATCHES = True

    @classmethod
    def open(cls, store: Store, ssd: SSDConfig, sampling: SamplerConfig, seed: int, device: torch.device,
             timer: StageTimer, scratch_dir: Path | None) -> SSDLoader:
        """The registry's uniform constructor: compact blocks under `scratch_dir`."""
        if scratch_dir is None:
            raise ValueError("features: ssd needs a scratch directory for its compact blocks")
        return cls(store, ssd, sampling, seed, device, timer, scratch_dir / "blocks")

    def __init__(self, store: Store, ssd: SSDConfig, sampling: SamplerConfig, seed: int,
                 device: torch.device, timer: StageTimer, block_dir: Path):
        self.store, self.sampling, self.seed, self.device, self.timer = store, sampling, seed, device, timer
        self.mega_batch = ssd.mega_batch
        try:
            check_numba_threads(ssd.threads, "ssd.threads")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.threads = ssd.threads
        self.packers = default_packers() if ssd.packers == "auto" else ssd.packers
        if not isinstance(self.packers, int) or isinstance(self.packers, bool) or self.packers < 0:
            raise ConfigError(f"ssd.packers: {ssd.packers!r} is invalid; expected auto, or an integer from 0")
        self._ssd = ssd
        self.labels = Labels(store)
        self.io = IOCounters()
        self.cost_model = load_cost_model(store.path)
        self.block_dir = block_dir  # scratch this loader owns: made on use, removed after
        self.kept_dir = block_dir.with_name(block_dir.name + "-kept")  # an epoch kept for reuse
        self._kept: KeptSamples | None = None
        self._holder: Iterator[MiniBatch] | None = None  # the stream holding the buffers
        total = ssd.memory_budget
        self.block_budget, why = resolve_block_budget(ssd.block_budget, store.feature_bytes, total, block_dir,
                                                      PACKED_FEATURE_SHARE if self.packers else AUTO_FEATURE_SHARE)
        log.info(why)
        row_bytes = store.row_bytes
        ranking = HotRanking(store, sampling.fanouts.array(store.schema))
        sampled = self._sampled_inputs()
        inputs = [rows for use in sampled.values() for rows in use]
        pinned = device.type == "cuda"
        gather_device = gather_on(ssd, store, device)
        device_rows = device_slice_rows(ssd, store, device)
        # the x arrays the consumer gets (the Recycler's) are the loader's memory too
        most_inputs = max(len(rows) for rows in inputs)
        x_bytes = x_pool_bytes(most_inputs, store.feat_dim, x_dtype(store.feat_dtype, not ssd.widen_on_device), pinned)
        sizing = queue_sizing_budget(total, x_bytes)
        self.staging_bytes = staging_bytes(sizing)
        self.plan_bytes = plan_bytes_in_flight(sizing)
        queue_bytes = self.staging_bytes + self.plan_bytes
        # each packer's share of the repack scan's staging and the block writer's chunks: the
        # scans that run at once (SCANS_AT_ONCE at most, whatever the packers: a share per
        # packer left 14 packers chunks of a fourteenth) together take what one repack thread
        # does; the packers plan within the plans' share (the planner's two plans, split
        # between them: all of them plan at once; the trainer's planner plans only its own
        # first mini-batches)
        share = max(1, min(self.packers, SCANS_AT_ONCE))
        self.repack_staging = max(MIN_STAGING, self.staging_bytes // share)
        # about as much for the block writer's chunks: a window's blocks fill at once (about
        # one a mini-batch of the window: pieces are cut in row order), each holding a chunk;
        # with a MiB each, a scan's writes cost a window of 10 mini-batches 0.13 CPU-s a
        # mini-batch against 0.20 with 5 MB for all (docs/BENCHMARKS.md, issue 46, seventh
        # round). The smallest staging keeps the 1 MiB it had (a small budget's queues as
        # before); the writer takes no more than its blocks' chunks (BlockWriter).
        self.writer_bytes = max(MIN_STAGING // 4, self.repack_staging - 3 * MIN_STAGING // 4)
        self.packer_plan_bytes = max(1, self.plan_bytes // PLANS_ALIVE // max(1, self.packers))
        if self.block_budget:
            # those, and the rows of the windows' blocks: with packers, the bitset each one
            # finds a window's scan rows in (a bit a row of the features: a window's rows are
            # mapped files, packers.RowsFile); else the plan stubs of two windows (8 bytes a
            # row of their blocks, half the block budget each: the repack thread's and the next)
            queue_bytes += share * (self.repack_staging + self.writer_bytes) + (
                self.packers * (store.feature_rows // 8 + 1) if self.packers
                else 2 * (self.block_budget // 2 // row_bytes) * 8)
        try:
            self.budget = ssd_split(total, row_bytes, queue_bytes, ssd.hot_fraction, store.feature_rows, BUFFERS,
                                    lambda count: _most_cold(inputs, HotRows.of(ranking.top(device_rows + count),
                                                                                 store.num_nodes)),
                                    held_bytes=x_bytes)
        except ValueError as exc:
            raise ConfigError(f"ssd.memory_budget: {exc}") from None
        (log.info if self.budget.spare_bytes >= 0 else log.warning)(
            "%s; %s", self.budget.describe(), x_sizing(sampling, store.num_edges, sampled))
        self.direct_io = DirectIO(queue_depth=ssd.queue_depth, backend=ssd.io_backend,
                                  checksums={store.features_path: store.page_checksums()}
                                  if ssd.verify_checksums else None)
        self.features = FeatureFile(self.direct_io, store.features_path, store.feat_dim, store.feat_dtype,
                                    self.cost_model, self.staging_bytes)
        with timer.stage("read"):
            # the device slice: the hottest rows; the host cache: the next ones
            self.hot = HotCache(self.features, ranking.top(device_rows + self.budget.hot_rows), store.num_nodes,
                                device_rows=ranking.top(device_rows), device=device,
                                pinned=pinned and gather_device is not None)
        log.info("features from %s through the %s backend; %s of hot rows loaded, %s of them on %s; x gathered "
                 "on %s; %s", store.features_path, self.direct_io.backend,
                 format_bytes(self.hot.nbytes + self.hot.device_nbytes), format_bytes(self.hot.device_nbytes),
                 device, gather_device or "the host", describe_model(store.path, self.cost_model))
        self.buffers = MegaBatchBuffers(self.hot, self.budget.buffer_rows, pinned=pinned,
                                        widen=not ssd.widen_on_device, device=gather_device)
        # for training's mini-batches (an evaluation's far larger x would be replaced by the first of them)
        self.buffers.prefault(max(len(rows) for rows in sampled["training"]))
        self.io.add(bytes_read=self.hot.nbytes + self.hot.device_nbytes)
        # a training mini-batch's cold rows: what sizes the packers' windows (_packed_stream)
        self._cold_bytes = _most_cold(sampled["training"], self.hot.members) * row_bytes
        #: CPU seconds each packer process's start took (interpreter, imports, store), by process ID
        self.packer_start_cpu_s: dict[int, float] = {}
        #: Mini-batches the trainer planned itself (page reads) in its latest stream with packers
        self.own_minibatches = 0
        self._pool: PackerPool | None = None  # the packers, once a stream needs them (_packer_pool)

    def _sampled_inputs(self) -> dict[str, list[np.ndarray]]:
        """The input rows of a few sampled mini-batches (one per split) with the training
        and with the evaluation settings ("training", "evaluation"): what the buffers and
        the x arrays are sized for. Drawn with SIZING_SEED, not the loader's seed: the same
        store and settings size every loader alike, so they are sampled once per Store object
        and settings (types.store_shared: a loader opened per evaluation on an open store
        samples nothing here)."""
        sampler_cfg = self.sampling
        settings = {"training": (sampler_cfg.fanouts, sampler_cfg.batch_size),
                    "evaluation": sampler_cfg.evaluation(self.store.num_edges)}
        key = ("x sizing", repr(settings), sampler_cfg.method)
        return store_shared(self.store, key, lambda: self._sample_inputs(settings), weak=False)

    def _sample_inputs(self, settings: dict[str, tuple[Fanouts, int]]) -> dict[str, list[np.ndarray]]:
        sampler_cfg = self.sampling
        rng = np.random.default_rng(SIZING_SEED)
        sampled: dict[str, list[np.ndarray]] = {}
        for use, (fanouts, batch_size) in settings.items():
            inputs = sampled[use] = []
            sample = _sizing_sampler(self.store, fanouts.array(self.store.schema), sampler_cfg.method)
            splits = [np.asarray(s) for s in (self.store.train_store_ids, self.store.valid_store_ids,
                                              self.store.test_store_ids)]
            # a link store has no node splits: its seeds (edge endpoints) are any nodes
            for nodes in [s for s in splits if len(s)] or [np.arange(self.store.num_nodes)]:
                inputs.append(sample(np.sort(rng.choice(nodes, min(len(nodes), batch_size), replace=False))))
        return sampled

    def minibatches(self, batches: list[np.ndarray], fanouts: Fanouts | list[Any], epoch: int = 0,
                    exclude: list[np.ndarray] | None = None, reuse_epochs: int = 1) -> Iterator[MiniBatch]:
        """A mini-batch per array of seed nodes, in order; neighbour draws are seeded by
        (seed, epoch, position). With `exclude`, batch b is sampled without the edges of the
        (E, 2) node pairs exclude[b] and their reverses (edge mini-batches; gnnssd.loading.edge_loader).
        With `reuse_epochs` > 1 (that many epochs train on these samples: sampler.reuse_epochs)
        the epoch's plans and blocks are kept on disk (within a share of the free space) once
        it is iterated to its end, the same call again replays them, and blocks are chosen for
        that many reads.

        One iteration at a time holds the buffers, the read stage and the scratch directory:
        the buffers carry rows from one plan to the next, so an iteration started while
        another is live (evaluation in the middle of an epoch, two iterators of one loader)
        stops the other's stages, and the other, when next advanced, plans again from its
        next mini-batch with the same neighbour draws. Every interleaving therefore yields
        what each iteration yields alone, at the cost of re-reading a mega-batch per switch."""
        fanouts = Fanouts.parse(fanouts).array(self.store.schema)
        done = 0
        while done < len(batches):
            stream = self._stream(batches, fanouts, epoch, exclude, reuse_epochs, done)
            if self._holder is not None:
                self._holder.close()  # its threads are joined and its scratch removed here
            self._holder = stream
            try:
                for batch in stream:
                    yield batch
                    del batch  # not held while the next one is made
                    done += 1
                    if self._holder is not stream:
                        break  # another iteration took the buffers: plan again from `done`
                else:
                    return
            finally:
                if self._holder is stream:
                    self._holder = None
                stream.close()

    def _stream(self, batches: list[np.ndarray], fanouts: np.ndarray, epoch: int,
                exclude: list[np.ndarray] | None, reuse_epochs: int, first: int) -> Iterator[MiniBatch]:
        """The mini-batches of batches[first:] through the four stages (see minibatches). A
        stream from the epoch's start may keep or replay the epoch; one resumed in the
        middle plans and reads as usual."""
        reuse = reuse_epochs > 1 and first == 0
        key = samples_key(batches, fanouts.tolist(), epoch, exclude) if reuse else ""
        if reuse and self._kept is not None and self._kept.complete and self._kept.key == key:
            yield from self._trained(self._replayed(self._kept))
            return
        if self.packers and not reuse:
            yield from self._packed_stream(batches, fanouts, epoch, exclude, first)
            return
        kept = None
        if reuse:  # the limit: measured once the previous kept epoch is deleted
            self._drop_kept()
            kept = self._kept = KeptSamples(key, self.kept_dir, disk_share(self.kept_dir))
        directory = self.kept_dir if reuse else self.block_dir
        planner = self._planner(fanouts)
        directory.mkdir(parents=True, exist_ok=True)
        spill = directory if self.block_budget or reuse else None
        rest = None if exclude is None else exclude[first:]
        plans = PlanWorker(self._planned(planner.plan_batches(batches[first:], epoch, rest, first), spill),
                           depth=2, name="gnnssd-plan", threads=self.threads, counted=_ends_minibatch)
        windows = self._repacked_windows(iter(plans), directory, reuse_epochs if reuse else 1)
        # repacking a window is long: its own thread, a window ahead; without blocks, plans
        # go from the planner to the read stage (no queue between: PLANS_ALIVE whole plans)
        repack = PlanWorker(windows, depth=2, name="gnnssd-repack", threads=self.threads) if self.block_budget else None
        done = (lambda plan, _: kept.keep(plan)) if kept is not None else delete
        try:
            yield from self._trained(self._loaded(((window, directory) for window in repack or windows), done))
            if kept is not None:  # iterated to its end: every plan was loaded
                kept.complete = kept.keeping
        finally:
            if repack is not None:
                repack.close()
            plans.close()
            if kept is None or not kept.complete:
                shutil.rmtree(directory, ignore_errors=True)

    def _plan_config(self, fanouts: np.ndarray) -> PlanConfig:
        return PlanConfig(fanouts=tuple(map(tuple, fanouts.tolist())), mega_batch=self.mega_batch, seed=self.seed,
                          method=self.sampling.method)

    def _planner(self, fanouts: np.ndarray) -> Planner:
        """A planner of this loader's settings (the trainer's; a packer's: _packer_spec)."""
        return Planner(self.store.indptr, self.store.indices, self._plan_config(fanouts), self.hot.members,
                       max_rows=self.budget.buffer_rows, max_bytes=self.plan_bytes // PLANS_ALIVE,
                       **sampler_options(self.store, self.store.etypes))

    def _packer_spec(self) -> PackerSpec:
        """What the packers plan with: this loader's planner (less a stream's fanouts, given
        with its windows), cost model and queues."""
        options = sampler_options(self.store, self.store.etypes)
        del options["etypes"]  # mapped by each packer from the store, not sent
        cores = len(os.sched_getaffinity(0))
        return PackerSpec(str(self.store.path), self.hot.members, self.budget.buffer_rows,
                          self.packer_plan_bytes, self.cost_model, self.block_budget // 2,
                          self.repack_staging, self.writer_bytes, self._ssd.queue_depth, self._ssd.io_backend,
                          self._ssd.verify_checksums, self.threads or max(1, cores // self.packers),
                          options)

    def _packer_pool(self) -> PackerPool:
        """The loader's packers: started by the first stream that needs them, kept for the
        streams after it (evaluation in the middle of an epoch restarts the training stream;
        each epoch is a stream), until the loader closes or a packer dies."""
        if self._pool is not None and (dead := self._pool.dead()):
            log.warning("ssd.packers: %s since the last stream; starting new packers", ", ".join(dead))
            self._pool.close()
            self._pool = None
        if self._pool is None:
            # the blocks' folder is the pool's (with packers, the trainer writes none)
            self._pool = PackerPool(self._packer_spec(), self.packers, self.packers, self.block_dir,
                                    report=self._count_repack, started=self.packer_start_cpu_s.__setitem__)
        return self._pool

    def _packed_stream(self, batches: list[np.ndarray], fanouts: np.ndarray, epoch: int,
                       exclude: list[np.ndarray] | None, first: int) -> Iterator[MiniBatch]:
        """_stream with packers: the trainer plans its own first mini-batches with page reads
        (no packer to wait for before the first mini-batch); then the packers plan (and,
        with a block budget, repack) every later window (window_bounds: small first, then
        full: within half the block budget, or PAGE_WINDOW mini-batches of page reads),
        `packers` of them given out ahead of the one being read; the trainer reads, verifies
        and gathers. The trainer's own window: FIRST_WINDOW mini-batches where the packers
        are running; where they are starting, until the first has started and FIRST_WINDOW
        more are planned (OWN_WINDOW_MOST, and a full window, at most). A stream of at most
        OWN_WINDOW_MOST mini-batches is the trainer's own: no packer takes part."""
        count = len(batches) - first
        rest = None if exclude is None else exclude[first:]
        # a full window: the mini-batches whose cold rows fill half the block budget (a packer
        # cuts a window whose blocks pass it in two; one with too few rows gets no blocks at all)
        full = max(1, -(-(self.block_budget // 2) // max(1, self._cold_bytes))) if self.block_budget else PAGE_WINDOW
        self.own_minibatches = 0
        # A starting pool's interpreters (~3 CPU-s each) overlap the trainer's own window
        # (the pool sends their specs and windows from threads of its own: nothing here waits)
        pool = self._packer_pool() if count > OWN_WINDOW_MOST else None
        config = self._plan_config(fanouts)

        def give(done: int) -> None:
            """The packers' windows: every mini-batch after the trainer's first `done`."""
            pool.assign(config, epoch, [(first + done + lo, batches[first + done + lo : first + done + hi],
                                         None if rest is None else rest[done + lo : done + hi])
                                        for lo, hi in window_bounds(count - done, full)])

        def own() -> Iterator[MegaBatchPlan]:
            """The trainer's plans (the packers given theirs once the first mini-batch is
            sampled where they are running, at the end of these where they are starting)."""
            running = pool is not None and pool.ready()
            # never more than a full window (where one holds a few mini-batches, as at 1/8 of
            # `medium`, the trainer's page reads would pass the packers' blocks)
            most = (count if pool is None else min(count, FIRST_WINDOW) if running
                    else min(count, OWN_WINDOW_MOST, max(FIRST_WINDOW, full)))
            planner = self._planner(fanouts)
            plans = planner.plan_batches(batches[first : first + most], epoch,
                                         None if rest is None else rest[:most], first)
            stop, given = most, False
            for plan in plans:
                yield plan
                if not plan.ends_minibatch:
                    continue  # a mini-batch in pieces ends with its last
                self.own_minibatches += len(plan.minibatches)
                if running and not given:  # not before: they would sample beside its sampling
                    give(most)
                    given = True
                if stop == most and not running and pool is not None and pool.ready():
                    stop = min(most, self.own_minibatches + FIRST_WINDOW)
                if self.own_minibatches >= stop:
                    break
            plans.close()
            if pool is not None and not given:
                give(self.own_minibatches)

        own_plans: PlanWorker | None = None
        try:
            own_plans = PlanWorker(self._planned(own(), None), depth=2, name="gnnssd-plan", threads=self.threads,
                                   counted=_ends_minibatch)
            windows = itertools.chain((([plan], None) for plan in own_plans), pool.windows() if pool else ())
            yield from self._trained(self._loaded(windows, delete))
        finally:
            if own_plans is not None:
                own_plans.close()
            if pool is not None:
                pool.end()  # its folders go once the packers have stopped writing them
                if pool.dead():  # its error was this stream's
                    self._pool = None
                    pool.close()

    def _trained(self, loading: Iterator[tuple[MegaBatchPlan, np.ndarray]]) -> Iterator[MiniBatch]:
        """The mini-batches of loaded plans, the read stage kept BUFFERS plans ahead in its
        own thread; waits for it are charged to `wait`. A piece plan (see Planner) adds its
        rows to the x being assembled, yielded with the last piece."""
        # Depth BUFFERS: the buffer the caller gathers from and the one being filled.
        loaded = PlanWorker(loading, depth=BUFFERS, name="gnnssd-read", threads=self.threads)
        assembling: np.ndarray | None = None
        try:
            pending = iter(loaded)
            while True:
                item = plan = buffer = None  # the plan trained on is not held while the next loads
                start = time.perf_counter()
                item = next(pending, None)
                self.timer.add("wait", time.perf_counter() - start)
                if item is None:
                    return
                plan, buffer = item
                if not plan.pieces:
                    yield from self._minibatches(plan, buffer)
                    continue
                with self.timer.stage("gather"):
                    if plan.piece == 0:  # the first piece carries the mini-batch's input count
                        assembling = self.buffers.take_x(plan.stats["input_rows"])
                    self._gather(plan, 0, buffer, assembling)
                if plan.ends_minibatch:
                    x, assembling = assembling, None
                    yield self._minibatch(plan.minibatches[0], x)
                    del x  # the next x is gathered while the caller holds only its own
        finally:
            loaded.close()

    def _replayed(self, kept: KeptSamples) -> Iterator[tuple[MegaBatchPlan, np.ndarray]]:
        """Read stage of a kept epoch: its plans in order, their files kept."""
        return self._loaded((([plan], kept.directory) for plan in kept.plans), lambda plan, directory: True)

    def _drop_kept(self) -> None:
        if self._kept is not None:
            self._kept.remove()
            self._kept = None

    def _planned(self, plans: Iterator[MegaBatchPlan], spill: Path | None) -> Iterator[MegaBatchPlan]:
        """Plan stage: mega-batch plans with their page reads planned. Plans wait for their
        repack window (or are kept for a replay) as stubs, their mini-batches spilled to
        `spill`: memory then does not grow with the window."""
        for plan in _timed(plans, self.timer, "plan"):
            with self.timer.stage("plan"):
                plan.read = pages_plan(plan.read_rows, self.store.row_bytes, self.cost_model)
                if spill is not None:
                    if not plan.ends_minibatch:
                        # every piece plan holds its mini-batch's blocks; only the last one's
                        # are used (it yields the mini-batch): the others spill without them
                        plan = replace(plan, minibatches=[])
                    plan = plan.spill(spill / f"plan_e{plan.epoch}_m{plan.index}.spill")
            yield plan

    def _repacked_windows(self, plans: Iterator[MegaBatchPlan], directory: Path,
                          uses: int) -> Iterator[list[MegaBatchPlan]]:
        """Repack stage (its own thread, behind the planner's): windows of plans, compact
        blocks written to `directory` for those the read planner gives one (each read `uses`
        times). Without a block budget, each plan is its own window with page reads."""
        if self.block_budget == 0:
            return ([plan] for plan in plans)
        return repacked_windows(plans, self.direct_io, self.store.features_path, self.store.row_bytes,
                                self.cost_model,
                                self.block_budget, directory, self.repack_staging, self.writer_bytes,
                                report=self._count_repack, uses=uses)

    def _count_repack(self, report: RepackReport) -> None:
        self.timer.add("repack", report.seconds)
        self.io.add(report.bytes_read, report.bytes_written, report.requests, part="packing")

    def _loaded(self, windows: Iterable[tuple[list[MegaBatchPlan], Path | None]],
                done: Callable[[MegaBatchPlan, Path | None], object]) -> Iterator[tuple[MegaBatchPlan, np.ndarray]]:
        """Read stage: each plan's buffer filled (blocks from its window's folder); then
        `done(plan, folder)` deletes its spill file and block, or keeps them for a replay."""
        for window, directory in windows:
            for plan in window:
                with self.timer.stage("read"):
                    full = plan.restore(keep_file=True) if plan.spill_path else plan
                    buffer = self.buffers.load(full, directory)
                self.io.add(bytes_read=full.read.nbytes, requests=len(full.read.offsets),
                            useful_bytes=full.stats["minibatch_cold_rows"] * self.store.row_bytes,
                            part="packed" if full.read.strategy is Strategy.BLOCK else "extents")
                done(plan, directory)
                yield full, buffer
                del full, buffer  # not held while the next plan is restored

    def _minibatches(self, plan: MegaBatchPlan, buffer: np.ndarray) -> Iterator[MiniBatch]:
        """The mini-batches of a loaded plan that is not a piece."""
        for i, mfgs in enumerate(plan.minibatches):
            with self.timer.stage("gather"):
                x = self._gather(plan, i, buffer)
            yield self._minibatch(mfgs, x)
            del x  # the next x is gathered while the caller holds only its own

    def _gather(self, plan: MegaBatchPlan, i: int, buffer: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """buffers.gather on `ssd.threads` numba threads (the caller's own setting restored)."""
        previous = numba_threads(self.threads)
        try:
            return self.buffers.gather(plan, i, buffer, out)
        finally:
            numba_threads(previous)

    @property
    def x_pool(self) -> Recycler:
        """Where every mini-batch's x lives before the consumer takes it: a small pool of
        recycled arrays (pinned when the loader's device is CUDA), reused once nothing
        references an x and the copy event given for it has completed (Recycler). A consumer
        that copies x (a tensor of a pool array, `x.numpy()` gives the array) to a device on its
        own stream calls `x_pool.release_after(x.numpy(), event)` with an event recorded after
        the copy; the loader does so itself for the copy MiniBatch.to makes on a CUDA device.
        float16 stores give float16 x with `ssd.widen_on_device`."""
        return self.buffers.outputs

    def _minibatch(self, mfgs: MFGs, features: np.ndarray | torch.Tensor) -> MiniBatch:
        """The mini-batch of gathered `features` (a pool array: see x_pool; or a tensor
        gathered on the device), on the device."""
        if isinstance(features, torch.Tensor):
            return self._device_minibatch(mfgs, features)
        cuda = self.device.type == "cuda"
        with self.timer.stage("gather"):
            # float16 kept for a consumer that widens it; int8 dequantized into new memory
            x = torch.from_numpy(features if features.dtype == np.float16
                                 else self.store.as_float32(features, mfgs.input_rows))
            if cuda and not x.is_pinned():
                x = x.pin_memory()
            y = self.labels[torch.from_numpy(mfgs.seeds)]
            parts = batch_parts(mfgs, self.store.schema, x)
        with self.timer.stage("transfer"):
            batch = MiniBatch(**parts, y=y).to(self.device, non_blocking=True)
            if cuda:  # the pool array is reused only once this asynchronous copy is done
                copied = torch.cuda.Event()
                copied.record()
                self.x_pool.release_after(features, copied)
            return batch

    def _device_minibatch(self, mfgs: MFGs, x: torch.Tensor) -> MiniBatch:
        """The mini-batch of an x assembled on the device in the stored dtype: float16
        widened there unless the consumer widens it (ssd.widen_on_device)."""
        with self.timer.stage("gather"):
            wanted = torch.from_numpy(np.empty(0, self.buffers.x_dtype)).dtype
            y = self.labels[torch.from_numpy(mfgs.seeds)]
            parts = batch_parts(mfgs, self.store.schema, x.to(wanted))
        with self.timer.stage("transfer"):
            return MiniBatch(**parts, y=y).to(self.device, non_blocking=True)

    def io_stats(self) -> dict[str, int]:
        """The disk's counters; the bytes read by repack scans ("packing_read_bytes"), from
        compact blocks ("packed_...") and as page extents ("extents_..."); and the x rows
        served so far from each level: the device slice (`rows_device`), the host hot cache
        (`rows_host_cache`), the reads (`rows_read`)."""
        return {**self.io.as_dict(), **self.io.parts(),
                **{key: self.buffers.level_rows[key] for key in ("rows_device", "rows_host_cache", "rows_read")}}

    def close(self) -> None:
        if self._holder is not None:
            self._holder.close()
        self._drop_kept()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self.features.close()
        self.direct_io.shutdown()


def _ends_minibatch(plan: MegaBatchPlan) -> bool:
    """What counts toward a planner's depth (PlanWorker's `counted`): a mini-batch's pieces
    count as one plan, their rows and slots one mini-batch's in all (Planner's pieces)."""
    return plan.ends_minibatch


def _timed(items: Iterator, timer: StageTimer, stage: str) -> Iterator:
    """Charge the time spent producing each item of `items` to `stage`."""
    while True:
        start = time.perf_counter()
        item = next(items, None)
        timer.add(stage, time.perf_counter() - start)
        if item is None:
            return
        yield item
        del item  # not held while the next one is made


def x_sizing(sampling: SamplerConfig, num_edges: int, sampled: dict[str, list[np.ndarray]]) -> str:
    """What the x arrays are sized for (the largest sampled mini-batch, of training or of
    evaluation) and the keys that size it, for the budget's log line: an x array over the
    budget from evaluation's all-neighbour default is shrunk by sampler.eval_fanouts or
    sampler.eval_batch_size (NodeLoader's eval_fanouts=, eval_batch_size=), not the
    training settings."""
    most = {use: max(len(rows) for rows in inputs) for use, inputs in sampled.items()}
    fanouts, batch_size = sampling.evaluation(num_edges)
    training = (f"training's (sampler.fanouts {sampling.fanouts}, sampler.batch_size {sampling.batch_size}): "
                f"~{most['training']:,} input rows")
    if most["evaluation"] <= most["training"]:
        return f"the x arrays are sized for the largest sampled mini-batch, {training}"
    default = ("" if sampling.eval_fanouts is not None else " (unset: all neighbours)"
               if fanouts == [-1] * len(fanouts) else " (unset)")
    return (f"the x arrays are sized for the largest sampled mini-batch, evaluation's (sampler.eval_fanouts "
            f"{fanouts}{default}, sampler.eval_batch_size {batch_size}): ~{most['evaluation']:,} input rows, "
            f"against {training}; smaller eval_fanouts or eval_batch_size shrink them")


def _sizing_sampler(store: Store, fanouts: np.ndarray, method: str) -> Callable[[np.ndarray], np.ndarray]:
    """The input rows of one sizing mini-batch of `seeds` (sorted store IDs), drawn with
    SIZING_SEED (`fanouts`: layers x relations, as Fanouts.array). A store of one relation
    samples with torch ops (TensorSampler: the numba sampler's blocks, edge for edge up to
    a fanout of 32; the same distribution above it),
    so opening a loader calls no numba kernel: numba's first call in a process (~1 s, its
    target's start-up) is left to the first mini-batch's planning, which pays it anyway. A
    typed store samples with the numba sampler (TensorSampler has no relations)."""
    if len(store.etypes):  # several relations
        sampler = NeighborSampler(store.indptr, store.indices, fanouts, **sampler_options(store, store.etypes),
                                  method=method)
        return lambda seeds: np.asarray(sampler.sample(seeds, SIZING_SEED).input_rows)
    with warnings.catch_warnings():  # the mapped CSC is read-only; the sampler only reads it
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        graph = torch.from_numpy(store.indptr.view(np.ndarray)), torch.from_numpy(store.indices.view(np.ndarray))
    tensors = TensorSampler(*graph, fanouts[:, 0].tolist(), sampling_method(method))
    return lambda seeds: tensors.sample(torch.from_numpy(seeds), SIZING_SEED)[0].numpy()


def gather_on(ssd: SSDConfig, store: Store, device: torch.device) -> torch.device | None:
    """The device x is assembled on (ssd.gather), or None for the host: "auto" is the
    device on a GPU. An int8 store is dequantized on the host, so it gathers there (a
    device slice, then, only on the CPU)."""
    if ssd.gather == "host" or (ssd.gather == "auto" and device.type != "cuda"):
        if ssd.device_budget and device.type == "cuda":
            raise ConfigError(f"ssd.gather: host cannot read the rows ssd.device_budget keeps on {device}; "
                              "set ssd.gather: device (or auto), or ssd.device_budget: 0")
        return None
    if store.row_scales is not None:
        if ssd.gather == "device" or ssd.device_budget:
            raise ConfigError(f"ssd.gather: device and ssd.device_budget need a float16 or float32 store; "
                              f"{store.path} is int8 (dequantized on the host)")
        return None
    return device


def device_slice_rows(ssd: SSDConfig, store: Store, device: torch.device) -> int:
    """Rows of the hottest slice `ssd.device_budget` keeps on `device` (all the rows at
    most), refused, naming the sizes, beyond its free memory less ssd.device_reserve of
    its total."""
    if not ssd.device_budget:
        return 0
    rows = min(ssd.device_budget // store.row_bytes, store.feature_rows)
    free, total = device_memory(device)
    usable = free - int(ssd.device_reserve * total)
    if rows * store.row_bytes > usable:
        raise ConfigError(f"ssd.device_budget: {format_bytes(rows * store.row_bytes)} of hot rows ({rows:,} rows of "
                          f"{store.row_bytes} B) do not fit on {device}: {format_bytes(free)} free of "
                          f"{format_bytes(total)}, less ssd.device_reserve {ssd.device_reserve:g} of it leaves "
                          f"{format_bytes(max(usable, 0))}; set a smaller ssd.device_budget (or ssd.device_reserve)")
    return rows


def _most_cold(inputs: list[np.ndarray], hot: HotRows) -> int:
    """Most input rows outside the hot rows among the sampled mini-batches' `inputs`: what
    a buffer holds to read a mini-batch in one piece."""
    return max(int(np.count_nonzero(~hot.contains(rows))) for rows in inputs)
