"""Where this process sits among the data-parallel ranks (one process when no process
group is initialised)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch.distributed as dist

from gnnssd.storage_format import env_int, env_text

#: The most ranks a process group may have (torchrun's WORLD_SIZE).
MAX_WORLD_SIZE = 1 << 16


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
    local_world = env_int("LOCAL_WORLD_SIZE", world, 1, world, f"at most WORLD_SIZE={world}")
    return Ranks(rank, world, env_int("LOCAL_RANK", rank % local_world, 0, local_world - 1,
                                      f"below LOCAL_WORLD_SIZE={local_world}"), local_world)


@dataclass(frozen=True)
class Launch:
    """The process group torchrun's environment describes: this rank, and where to meet."""

    ranks: Ranks
    master_addr: str
    master_port: int


def torchrun_environment() -> Launch:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, each
    checked (an integer in its range, the rank below the world size, a port from 1 to
    65535) before torch reads them: RANK=0 WORLD_SIZE=0 crashed its store creation, and
    RANK=abc failed with an int() error that named no variable."""
    world = env_int("WORLD_SIZE", None, 1, MAX_WORLD_SIZE)
    rank = env_int("RANK", None, 0, world - 1, f"below WORLD_SIZE={world}")
    local_world = env_int("LOCAL_WORLD_SIZE", world, 1, world, f"at most WORLD_SIZE={world}")
    local_rank = env_int("LOCAL_RANK", rank % local_world, 0, local_world - 1, f"below LOCAL_WORLD_SIZE={local_world}")
    return Launch(Ranks(rank, world, local_rank, local_world), env_text("MASTER_ADDR"),
                  env_int("MASTER_PORT", None, 1, 65535))


def launched_by_torchrun() -> bool:
    """True in a process that torchrun (or the elastic launcher) started as a rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
