"""Process-wide set-up for training: device choice, seeding, thread counts."""
from __future__ import annotations

import logging
import random
import warnings

import dgl
import numpy as np
import torch

log = logging.getLogger("gnnssd")

# DGL warns on every DataLoader that CPU affinity is off; it is a tuning hint, not a fault.
warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")


def _dgl_has_cuda() -> bool:
    try:
        dgl.graph(([0], [0])).to("cuda")
    except Exception:  # DGL's CPU build raises a plain DGLError
        return False
    return True


def select_device(preference: str) -> torch.device:
    """CUDA when both torch and DGL have it (unless the config says cpu); the choice is logged."""
    cuda = torch.cuda.is_available() and _dgl_has_cuda()
    if preference == "cuda" and not cuda:
        raise RuntimeError("device: 'cuda' requested, but "
                           + ("this DGL build has no CUDA" if torch.cuda.is_available()
                              else "torch sees no CUDA device"))
    device = torch.device("cuda" if cuda and preference != "cpu" else "cpu")
    log.info("device: %s (%s)", device, "CUDA available" if cuda else "no CUDA in torch+DGL")
    return device


def seed_everything(seed: int) -> None:
    """Seed every RNG a run draws from (Python, NumPy, torch, DGL's sampler)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    dgl.seed(seed)


def use_single_thread() -> None:
    """Make CPU kernels run in a fixed order (see Config.deterministic)."""
    torch.set_num_threads(1)
    dgl.utils.set_num_threads(1)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch: a resumed run draws exactly what an uninterrupted one would."""
    return (seed * 1_000_003 + epoch) % 2**63
