"""Where this process sits among the data-parallel ranks (one process when no process
group is initialised)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """Where this process sits: its rank among all, and among the ranks of its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def active(self) -> bool:
        """More than one rank: seeds are sharded and gradients averaged."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes metrics, logs and checkpoints."""
        return self.rank == 0

    def split(self, nodes: np.ndarray) -> np.ndarray:
        """This rank's share of evaluation nodes: every node on exactly one rank, no padding."""
        return np.asarray(nodes)[self.rank::self.world_size]


def current() -> Ranks:
    """This process's ranks: from the initialised default process group, or one process."""
    if not (dist.is_available() and dist.is_initialized()):
        return Ranks()
    rank, world = dist.get_rank(), dist.get_world_size()
    return Ranks(rank, world, int(os.environ.get("LOCAL_RANK", rank)),
                 int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def launched_by_torchrun() -> bool:
    """True in a process that torchrun (or the elastic launcher) started as a rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
