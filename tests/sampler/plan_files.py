"""Plans as files, for tests: one .npz per mega-batch plan (`save_plan`, `load_plan`), and a
plan stream written as it passes (`saving`) and read back in training order (`replay`).
The loader itself only spills plans to its scratch (gnnssd.sampler.plan's spill files)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from gnnssd.sampler import MegaBatchPlan
from gnnssd.sampler.plan import _plan_arrays, _plan_from_arrays


def save_plan(plan: MegaBatchPlan, path: str | Path) -> None:
    """One .npz per mega-batch plan; `load_plan` gives back an equal plan."""
    with open(path, "wb") as f:
        np.savez(f, **_plan_arrays(plan))


def load_plan(path: str | Path) -> MegaBatchPlan:
    with np.load(path) as z:
        return _plan_from_arrays({k: z[k] for k in z.files})


def saving(plans: Iterable[MegaBatchPlan], directory: str | Path) -> Iterator[MegaBatchPlan]:
    """Pass plans through, writing each to directory/plan_e{epoch}_m{index}.npz."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for p in plans:
        save_plan(p, directory / f"plan_e{p.epoch:05d}_m{p.index:06d}.npz")
        yield p


def replay(directory: str | Path) -> Iterator[MegaBatchPlan]:
    """Saved plans in training order."""
    for path in sorted(Path(directory).glob("plan_e*_m*.npz")):
        yield load_plan(path)
