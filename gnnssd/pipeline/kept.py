"""An epoch's samples kept on disk for the epochs that reuse them (`sampler.reuse_epochs`).

The first epoch of a group plans, repacks and reads as usual but keeps each loaded plan's
spill file and compact block; the group's other epochs replay them in the same order: no
sampling, planning or repacking, and reads of the blocks alone (after DiskGNN, which trains
several epochs on one epoch's pre-sampled, packed inputs). The files kept are bounded: past
`limit` bytes nothing more is kept, the epoch's files are deleted as usual, and the next
epoch plans again (the same samples, read the usual way).
"""
from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from gnnssd.pipeline.repack import delete, plan_files
from gnnssd.sampler import MegaBatchPlan

log = logging.getLogger("gnnssd.ssd")


def samples_key(batches: list[np.ndarray], fanouts: list[int], epoch: int,
                exclude: list[np.ndarray] | None) -> str:
    """What identifies an epoch's samples: its seed batches, fanouts, epoch and excluded edges."""
    digest = hashlib.blake2b(repr((epoch, list(fanouts), len(batches))).encode(), digest_size=16)
    for arrays in (batches, exclude or []):
        for a in arrays:
            digest.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
            digest.update(b"|")
    return digest.hexdigest()


class KeptSamples:
    """The loaded plans of one epoch, kept in `directory` in training order as stubs that
    name their files (a stub's `rows` are dropped: replay restores the whole plan from its
    spill file). `key` is `samples_key` of the epoch; `complete` once its last plan is in."""

    def __init__(self, key: str, directory: Path, limit: int):
        self.key, self.directory, self.limit = key, directory, limit
        self.plans: list[MegaBatchPlan] = []
        self.nbytes = 0
        self.keeping = True
        self.complete = False

    def keep(self, plan: MegaBatchPlan) -> bool:
        """Keep a loaded plan's files, or delete them (and all kept so far) once they would
        pass the limit; True if kept."""
        if self.keeping:
            size = sum(f.stat().st_size for f in plan_files(plan, self.directory))
            if self.nbytes + size <= self.limit:
                self.nbytes += size
                empty = plan.rows[:0]
                self.plans.append(replace(plan, rows=empty, carry_src=empty))
                return True
            log.warning("sampler.reuse_epochs: this epoch's plans and blocks pass %s MiB (a "
                        "share of the free disk under %s); the next epoch samples the same "
                        "mini-batches and reads them again", self.limit >> 20, self.directory)
            self.keeping = False
            for kept in self.plans:
                delete(kept, self.directory)
            self.plans = []
        delete(plan, self.directory)
        return False

    def remove(self) -> None:
        """Delete every kept file."""
        shutil.rmtree(self.directory, ignore_errors=True)
