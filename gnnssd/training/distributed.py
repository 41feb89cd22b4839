"""Data-parallel training with torch.distributed: ranks, seed shards, DDP, fault reports.

One process per rank, each with its own NodeLoader over its shard of every epoch's seeds
(NodeLoader shards by the process group's rank) and the model wrapped in
DistributedDataParallel. `gnnssd train --nproc N` starts N local ranks through torch's
elastic launcher (what torchrun runs); under `torchrun` the ranks come from its
environment (RANK, WORLD_SIZE, MASTER_ADDR, ...). Backend: gloo on CPU, nccl for CUDA
tensors. Set-up (store check, checkpoint, loaders) may take the ranks
different times and waits up to SETUP_TIMEOUT; from DDP's first broadcast on, collectives
time out after GNNSSD_DIST_TIMEOUT seconds (default 30), and each rank posts its progress
and a heartbeat to the rendezvous store so that a failed collective names the ranks that
stopped.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from torch.nn.parallel import DistributedDataParallel

from gnnssd.core import Config, ConfigError, Ranks, current, setup_logging, torchrun_environment
from gnnssd.storage_format import Store, StoreError, env_seconds

log = logging.getLogger("gnnssd.training.distributed")

TIMEOUT_ENV = "GNNSSD_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: past it a hung rank is never noticed (and inf overflowed timedelta)
SETUP_TIMEOUT = timedelta(minutes=10)
PROGRESS_KEY = "gnnssd/progress/{}"
HEARTBEAT_KEY = "gnnssd/heartbeat/{}"
HEARTBEAT_S = 1.0


def collective_timeout() -> timedelta:
    """How long a rank waits in a collective for the others (GNNSSD_DIST_TIMEOUT seconds)."""
    return timedelta(seconds=env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, 1e-3, MAX_TIMEOUT_S))


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """Each local rank on its own GPU when there are several."""
    if device.type != "cuda" or not ranks.active:
        return device
    local = torch.device("cuda", ranks.local_rank % torch.cuda.device_count())
    torch.cuda.set_device(local)
    return local


def share_budget(config: Config, ranks: Ranks) -> Config:
    """The config a rank's ssd loader uses: `ssd.memory_budget` is the machine's total,
    split evenly between its local ranks."""
    if ranks.local_world_size == 1:
        return config
    share = config.ssd.memory_budget // ranks.local_world_size
    return dataclasses.replace(config, ssd=dataclasses.replace(config.ssd, memory_budget=share))


def wrap(model: torch.nn.Module, ranks: Ranks, device: torch.device,
         unused_parameters: bool = False) -> torch.nn.Module:
    """The model that trains: DDP (rank 0's initial weights broadcast) over several ranks;
    `unused_parameters`: a step may leave some parameters without a gradient."""
    if not ranks.active:
        return model
    dist.barrier()  # set-up done on every rank (the default group's long timeout)
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                   process_group=_training_group, find_unused_parameters=unused_parameters)


class Heartbeat:
    """A thread that bumps this rank's counter in the rendezvous store every HEARTBEAT_S
    through its own connection. A rank that died or hangs (stopped, deadlocked) stops
    beating; a rank that merely waits in a collective for another goes on."""

    def __init__(self, host: str, port: int, rank: int):
        self.host, self.port = host, port
        self._client = self._connect()
        self._key = HEARTBEAT_KEY.format(rank)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="gnnssd-heartbeat")
        self._thread.start()

    def _connect(self) -> dist.TCPStore:
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=5),
                             wait_for_workers=False)

    def _beat(self) -> None:
        try:
            while not self._stop.wait(HEARTBEAT_S):
                self._client.add(self._key, 1)
        except RuntimeError:  # the store's host is gone: the collectives will say so
            return

    def silent_ranks(self, world_size: int) -> set[int]:
        """Ranks whose heartbeat did not advance over three beats (a connection of its own:
        the beating thread owns the other)."""
        client = self._connect()

        def beats() -> list[int]:
            return [client.add(HEARTBEAT_KEY.format(r), 0) for r in range(world_size)]

        before = beats()
        time.sleep(3 * HEARTBEAT_S)
        return {r for r, (a, b) in enumerate(zip(before, beats())) if a == b}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Progress:
    """Each rank's count of collectives entered, in the rendezvous store: when a
    collective fails, the ranks that are behind this one, or whose heartbeat stopped
    (stopped between entering a collective and sending their part), are the ones that
    died or hung."""

    def __init__(self, store: dist.Store | None, ranks: Ranks, heartbeat: Heartbeat | None = None):
        self.store, self.ranks, self.heartbeat, self.count = store, ranks, heartbeat, 0

    def enter(self) -> None:
        """Called before each collective of the training loop."""
        self.count += 1
        if self.store is not None:
            self.store.set(PROGRESS_KEY.format(self.ranks.rank), str(self.count))

    def stalled(self) -> dict[int, int | None]:
        """Ranks that stopped: rank -> collectives entered (None: never posted)."""
        if self.store is None:
            return {}
        self.store.set_timeout(timedelta(seconds=5))
        self.store.set(PROGRESS_KEY.format(self.ranks.rank), str(self.count))  # raises if the store is gone
        silent = self.heartbeat.silent_ranks(self.ranks.world_size) if self.heartbeat else set()
        stopped: dict[int, int | None] = {}
        for rank in range(self.ranks.world_size):
            try:
                count: int | None = int(self.store.get(PROGRESS_KEY.format(rank)))
            except RuntimeError:  # never posted: the get timed out
                count = None
            if rank != self.ranks.rank and (count is None or count < self.count or rank in silent):
                stopped[rank] = count
        return stopped

    def failure(self, exc: BaseException) -> RuntimeError | None:
        """`exc` as an error naming the ranks that stopped, or None when every other rank
        is alive and not behind this one (then `exc` is not about the others)."""
        me = self.ranks.rank
        try:
            stopped = self.stalled()
        except (RuntimeError, OSError) as store_error:  # the store's host (rank 0) is gone
            return RuntimeError(f"rank {me}: lost contact with rank 0 (it hosts the rendezvous "
                                f"store: {store_error}) after {self.count} collectives: {exc}")
        if not stopped:
            return None
        named = ", ".join(f"rank {r} (at collective {c or 0})" for r, c in sorted(stopped.items()))
        return RuntimeError(f"rank {me}: {named} stopped answering (died or hung) while this "
                            f"rank waited in collective {self.count}: {exc}")


_progress_store: dist.Store | None = None
_heartbeat: Heartbeat | None = None
_training_group: dist.ProcessGroup | None = None  # short timeout; None: the default group


def progress(ranks: Ranks) -> Progress:
    """This process's progress counter (posting to the store when gnnssd set up the group)."""
    if not ranks.active:
        return Progress(None, ranks)
    return Progress(_progress_store, ranks, _heartbeat)


def init_from_env() -> Ranks:
    """Join the process group torchrun's environment describes (gloo on CPU, and nccl for
    CUDA tensors when there is a GPU); each rank gets its share of the CPU threads."""
    global _progress_store, _training_group, _heartbeat
    launch = torchrun_environment()  # checked before torch's rendezvous reads them
    timeout = collective_timeout()
    store, rank, world = next(dist.rendezvous("env://", timeout=SETUP_TIMEOUT))
    if torch.cuda.is_available():
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=SETUP_TIMEOUT)
    _training_group = dist.new_group(backend=backend, timeout=timeout)
    store.set_timeout(timeout)  # progress posts fail, not wait, when the store's host hangs
    _progress_store = store
    _heartbeat = Heartbeat(launch.master_addr, launch.master_port, rank)
    ranks = current()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks.local_world_size))
    return ranks


@record
def run_rank(job: Callable[..., Any], *args: Any) -> Any:
    """One rank: join the group, run `job(*args)`, leave. Rank 0 logs at INFO, the others
    only warnings. A failed job leaves the group as it is: the process exits, and
    destroying a group whose peer (or store host) is gone can wait forever. The heartbeat
    stops either way: a daemon thread still inside a store call when the interpreter
    exits is killed mid-C++ and aborts the process (SIGABRT instead of the job's exit code)."""
    setup_logging()
    ranks = init_from_env()
    if not ranks.is_main:
        logging.getLogger("gnnssd").setLevel(logging.WARNING)
    try:
        result = job(*args)
    finally:
        stop_heartbeat()
    dist.destroy_process_group()  # every group
    return result


def launched_rank(job: Callable[..., Any], *args: Any) -> Any:
    """A rank that `launch` started: `run_rank`, and once it succeeded and its result is
    handed to the launcher, the process ends without the interpreter's teardown (torch's,
    gloo's, DGL's and numba's modules and C++ destructors: 3-8 s a rank on a loaded 2-core
    machine, and the launcher waits for every rank to end). Everything the job wrote is
    closed by then; what it printed or logged is flushed first."""
    result = run_rank(job, *args)
    atexit.register(_end_at_once)  # runs first at exit: after the launcher's handshake, before the teardown
    return result


def _end_at_once() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def stop_heartbeat() -> None:
    """Stop this rank's heartbeat thread, if it beats."""
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None


MAX_LOCAL_RANKS = max(8, 2 * (os.cpu_count() or 1))


def launch(nproc: int, job: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """Run `job(*args)` on `nproc` local ranks with torch's elastic launcher (torchrun's
    agent: a c10d rendezvous on a free port of 127.0.0.1, no restarts); returns each
    rank's result. When a rank fails, the launcher stops the others and the error names
    every failed rank. At most MAX_LOCAL_RANKS ranks (each is a full process with its own
    model and loader): more is a typo, not a plan."""
    if not 1 <= nproc <= MAX_LOCAL_RANKS:
        raise ConfigError(f"--nproc {nproc}: expected 1..{MAX_LOCAL_RANKS} local ranks (this "
                          f"machine has {os.cpu_count()} CPUs)")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", local_addr="127.0.0.1",
                          max_restarts=0, monitor_interval=1)
    for name in list(logging.root.manager.loggerDict):  # the summary below replaces their reports
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        return elastic_launch(config, launched_rank)(job, *args)
    except ChildFailedError as exc:
        raise RuntimeError(describe_failures(exc.failures)) from None


def describe_failures(failures: dict[int, ProcessFailure]) -> str:
    """One line per failed rank: killed by which signal, or the error it raised."""
    lines = []
    for rank, failure in sorted(failures.items()):
        if failure.exitcode < 0:
            what = f"killed by {failure.signal_name()}"
        else:
            what = f"exited with code {failure.exitcode}"
            # the error file that @record wrote: the rank's exception, or a dict holding it
            message = failure.message if isinstance(failure.message, str) else failure.message.get("message", "")
            if failure.error_file_data.get("message"):
                what += f": {message.strip()}"
        lines.append(f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) {what}")
    return f"{len(failures)} of the ranks failed; " + "; ".join(lines)


def check_same_store(store: Store, ranks: Ranks) -> None:
    """Refuse to train when the ranks opened different stores (their manifests differ)."""
    if not ranks.active:
        return
    seen: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(seen, (store.fingerprint, str(store.path)))
    reference = seen[0][0]
    differ = [f"rank {r}: {path} (manifest sha256 {fp[:12]})"
              for r, (fp, path) in enumerate(seen) if fp != reference]
    if differ:
        raise StoreError(f"the ranks opened different stores: rank 0: {seen[0][1]} (manifest sha256 "
                         f"{reference[:12]}) but {'; '.join(differ)}; every rank needs a copy of "
                         "the same preprocessed store")


#: Config keys a rank may set its own way: where its files are, and how it shows progress.
PER_RANK_KEYS = ("store", "run_dir", "base_dir", "train.progress")


def _training_keys(config: Config) -> dict[str, Any]:
    """The config as dotted keys, without the per-rank ones."""
    flat: dict[str, Any] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = value

    walk(dataclasses.asdict(config), "")
    return {k: v for k, v in flat.items() if k not in PER_RANK_KEYS}


def check_same_config(config: Config, ranks: Ranks) -> None:
    """Refuse to train when the ranks' configs differ beyond their paths: a different
    batch size makes them run different numbers of collectives (gloo aborts), a different
    learning rate trains diverging replicas."""
    if not ranks.active:
        return
    seen: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(seen, _training_keys(config))
    reference = seen[0]
    for rank, keys in enumerate(seen):
        differ = [f"{k} {keys.get(k)!r} (rank 0: {reference.get(k)!r})"
                  for k in sorted(set(keys) | set(reference)) if keys.get(k) != reference.get(k)]
        if differ:
            raise ConfigError(f"the ranks' training configs differ: rank {rank} has {', '.join(differ)}; "
                              "start every rank with the same config (only store, run_dir and "
                              "train.progress may differ)")


def from_rank0(load: Callable[[], Any], ranks: Ranks, training: bool = False) -> Any:
    """`load()` run on rank 0 and its result (or its error) shared with every rank: the
    checkpoint is read once, and a bad one fails every rank the same way. `training`: a
    call between epochs, under the training collectives' short timeout (a rank that hangs
    there is named as one in a step is, not after the set-up's ten minutes)."""
    if not ranks.active:
        return load()
    box: list[Any] = [None]
    if ranks.is_main:
        try:
            box[0] = ("ok", load())
        except Exception as exc:  # re-raised below on every rank
            box[0] = ("error", exc)
    dist.broadcast_object_list(box, src=0, group=_training_group if training else None)
    status, value = box[0]
    if status == "error":
        raise value
    return value


def check_world_size(checkpoint: dict[str, Any], ranks: Ranks, run_dir: Any) -> None:
    """A run resumes with the world size it was trained with (the seed shards and the
    optimizer's steps depend on it)."""
    saved = checkpoint.get("world_size", 1)
    if saved != ranks.world_size:
        raise ConfigError(f"{run_dir}: the checkpoint was trained on {saved} rank(s), this run "
                          f"has {ranks.world_size}; resume with --nproc {saved} (or torchrun with "
                          f"{saved} ranks in all), or train afresh in another run_dir")


def sum_over_ranks(values: list[float], ranks: Ranks) -> list[float]:
    """Element-wise sums of `values` over all ranks (float64)."""
    if not ranks.active:
        return values
    total = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(total, group=_training_group)
    return total.tolist()


def gather_arrays(arrays: tuple[np.ndarray, ...], ranks: Ranks) -> tuple[np.ndarray, ...]:
    """Each of `arrays` concatenated over the ranks, in rank order."""
    if not ranks.active:
        return arrays
    seen: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(seen, arrays, group=_training_group)
    return tuple(np.concatenate(parts) for parts in zip(*seen))
