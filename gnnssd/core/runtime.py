"""Process-wide set-up for training: device choice, seeding, thread counts."""
from __future__ import annotations

import contextlib
import functools
import logging
import random
import signal
import threading
import warnings
from typing import Iterator

import dgl
import numpy as np
import torch

from .config import ConfigError

log = logging.getLogger("gnnssd")

# DGL warns on every DataLoader that CPU affinity is off; it is a tuning hint, not a fault.
warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")


@functools.cache
def dgl_has_cuda() -> bool:
    """Whether this DGL build can hold graphs on a GPU (PyPI's wheels cannot); asked once
    per process (every mini-batch copied to a GPU consults it)."""
    if not torch.cuda.is_available():
        return False
    try:
        dgl.graph(([0], [0])).to("cuda")
    except Exception:  # DGL's CPU build raises a plain DGLError
        return False
    return True


def select_device(preference: str) -> torch.device:
    """CUDA whenever torch sees a GPU (unless the config says cpu), else the CPU; which
    compute path runs there is logged. Without DGL's CUDA build (PyPI's DGL is CPU-only)
    the models run as gnnssd's compiled layers on CSC blocks (gnnssd.compiler.CSCBlock)."""
    if preference == "cpu":
        log.info("device: cpu (the config's choice)")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if preference == "cuda":
            reason = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
                      else f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")
            raise ConfigError(f"device: 'cuda' requested, but {reason}; use device: auto or cpu")
        log.info("device: cpu (torch sees no CUDA device)")
        return torch.device("cpu")
    path = ("dgl.nn and compiled layers on DGL's CUDA blocks" if dgl_has_cuda()
            else "compiled layers on CSC blocks (this DGL is CPU-only)")
    log.info("device: cuda, %s; compute: %s", torch.cuda.get_device_name(), path)
    return torch.device("cuda")


#: Seeds every consumer accepts: DGL takes a C int, NumPy's and the planner's RNGs no negatives.
SEED_RANGE = 2**31 - 1


def run_seed(seed: int) -> int:
    """Any integer seed (negative, or past 2**31) mapped into [0, SEED_RANGE); every RNG of
    a run (Python, NumPy, torch, DGL, the planner) is seeded from this value."""
    return seed % SEED_RANGE


def seed_everything(seed: int) -> None:
    """Seed every RNG a run draws from (Python, NumPy, torch, DGL's sampler)."""
    seed = run_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)


def use_single_thread() -> None:
    """Make CPU kernels run in a fixed order (see Config.deterministic)."""
    torch.set_num_threads(1)
    dgl.utils.set_num_threads(1)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch: a resumed run draws exactly what an uninterrupted one would."""
    return (run_seed(seed) * 1_000_003 + epoch) % SEED_RANGE


class _Interrupts:
    """SIGINT state of the process: whether the main thread is inside an uninterruptible
    step, and whether a Ctrl-C arrived during one."""

    depth = 0
    pending = False


@contextlib.contextmanager
def one_interrupt() -> Iterator[None]:
    """The first Ctrl-C raises KeyboardInterrupt as usual (after the model step in progress,
    see `uninterruptible`); later ones are then ignored (the process is on its way out), so
    cleanup (joining the I/O threads, removing scratch) runs to its end. Without an
    interrupt, the previous handler is back when the block exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    interrupted = False

    def first(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if _Interrupts.depth:
            _Interrupts.pending = True
        else:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        _Interrupts.pending = False
        if not interrupted:  # once interrupted, stay deaf until the process exits
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """A model step (forward, backward, optimizer step) that a Ctrl-C does not cut: the
    interrupt is raised when the step ends. A KeyboardInterrupt raised inside DGL's Python
    backward leaves autograd nodes in the engine's thread-local queue, and freeing them at
    exit waits for the GIL forever; a step cut in half would also leave the model and the
    optimizer out of step."""
    _Interrupts.depth += 1
    try:
        yield
    finally:
        _Interrupts.depth -= 1
    if _Interrupts.pending and not _Interrupts.depth:
        _Interrupts.pending = False
        raise KeyboardInterrupt
