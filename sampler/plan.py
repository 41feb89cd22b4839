"""Mega-batch plans: which feature rows each group of M mini-batches needs, and where.

Each epoch the training nodes are permuted with a seed derived from (config seed, epoch),
cut into mini-batches of B seeds (exactly those of standard training), and grouped into
mega-batches of M mini-batches. For a mega-batch the plan holds the sampled blocks, the
union of their input rows split into hot-cache rows, rows carried over from the previous
mega-batch's buffer and rows to read, and per mini-batch the index of each input row in
the concatenation [hot cache | mega-batch buffer], so the gather is one index_select.

Buffer slot order is [rows to read, ascending | carried rows, ascending]: reads land at the
front of an aligned buffer (a compact block can be read straight into it) and carried rows
are copied behind them from the previous buffer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .blocks import MFGs
from .readplan import ReadPlan
from .sampling import NeighborSampler


@dataclass(frozen=True)
class PlanConfig:
    batch_size: int
    fanouts: tuple[int, ...]
    mega_batch: int  # M: mini-batches per mega-batch
    seed: int = 0
    locality: bool = False  # draw a mega-batch's seeds from a contiguous range of node IDs
    drop_last: bool = False


@dataclass
class MegaBatchPlan:
    epoch: int
    index: int  # mega-batch index within the epoch
    minibatches: list[MFGs]
    gather: list[np.ndarray]  # per mini-batch: int64 index into [hot cache | buffer]
    rows: np.ndarray  # int64 store row of each buffer slot
    num_read: int  # rows[:num_read] come from disk, rows[num_read:] from the previous buffer
    carry_src: np.ndarray  # int64 slot in the previous buffer of rows[num_read:]
    num_hot: int  # rows in the hot cache (offset of the buffer in the concatenation)
    stats: dict = field(default_factory=dict)
    read: ReadPlan | None = None  # filled by the read planner

    @property
    def read_rows(self) -> np.ndarray:
        return self.rows[: self.num_read]

    def equals(self, other: "MegaBatchPlan") -> bool:
        same = (
            (self.epoch, self.index, self.num_read, self.num_hot) == (other.epoch, other.index, other.num_read, other.num_hot)
            and len(self.minibatches) == len(other.minibatches)
            and all(a.equals(b) for a, b in zip(self.minibatches, other.minibatches))
            and all(np.array_equal(a, b) for a, b in zip(self.gather, other.gather))
            and np.array_equal(self.rows, other.rows)
            and np.array_equal(self.carry_src, other.carry_src)
            and self.stats == other.stats
        )
        if (self.read is None) != (other.read is None):
            return False
        return same and (self.read is None or self.read.equals(other.read))


def minibatch_seeds(train_idx: np.ndarray, cfg: PlanConfig, epoch: int) -> list[np.ndarray]:
    """The epoch's mini-batches of seed nodes, in training order.

    Default: a uniform permutation. With `locality`, the sorted training nodes (rotated by a
    random offset) are cut into runs of B*M, the runs are visited in random order and each
    run is shuffled into its M mini-batches: a mega-batch's seeds are then neighbours in the
    store's node order, which (with a locality order) means neighbours in the graph.
    """
    rng = np.random.default_rng([cfg.seed, epoch])
    train = np.asarray(train_idx, dtype=np.int64)
    if cfg.locality:
        span = cfg.batch_size * cfg.mega_batch
        ordered = np.roll(np.sort(train), -int(rng.integers(len(train))))
        runs = [ordered[i : i + span] for i in range(0, len(ordered), span)]
        order = np.concatenate([rng.permutation(runs[r]) for r in rng.permutation(len(runs))])
    else:
        order = rng.permutation(train)
    stop = len(order) - len(order) % cfg.batch_size if cfg.drop_last else len(order)
    return [order[i : i + cfg.batch_size] for i in range(0, stop, cfg.batch_size)]


def build_megabatch(
    mfgs: list[MFGs], hot_rows: np.ndarray, prev_rows: np.ndarray | None, epoch: int, index: int
) -> MegaBatchPlan:
    """Union, hot/carried/read split and gather indices for one group of mini-batches.

    hot_rows: sorted store rows held by the hot cache (slot = position).
    prev_rows: the previous mega-batch's buffer rows in slot order (or None).
    """
    inputs = [m.input_nodes for m in mfgs]
    allin = np.concatenate(inputs)
    uniq = np.unique(allin)
    num_hot = len(hot_rows)
    hot_pos = np.searchsorted(hot_rows, uniq)
    is_hot = hot_pos < num_hot
    is_hot[is_hot] = hot_rows[hot_pos[is_hot]] == uniq[is_hot]
    cold = uniq[~is_hot]
    if prev_rows is not None and len(prev_rows):
        prev_order = np.argsort(prev_rows, kind="stable")
        prev_sorted = prev_rows[prev_order]
        pos = np.minimum(np.searchsorted(prev_sorted, cold), len(prev_sorted) - 1)
        carried = prev_sorted[pos] == cold
        carry_src = prev_order[pos[carried]].astype(np.int64)
    else:
        carried = np.zeros(len(cold), bool)
        carry_src = np.empty(0, np.int64)
    read_rows, carry_rows = cold[~carried], cold[carried]
    slot = np.empty(len(cold), np.int64)
    slot[~carried] = np.arange(len(read_rows))
    slot[carried] = len(read_rows) + np.arange(len(carry_rows))
    value = np.empty(len(uniq), np.int64)
    value[is_hot] = hot_pos[is_hot]
    value[~is_hot] = num_hot + slot
    gather_all = value[np.searchsorted(uniq, allin)]
    gather = np.split(gather_all, np.cumsum([len(x) for x in inputs])[:-1])
    hot_hits = int((gather_all < num_hot).sum())
    stats = {
        "minibatches": len(mfgs),
        "input_rows": int(len(allin)),
        "unique_rows": int(len(uniq)),
        "sharing": float(len(allin) / max(len(uniq), 1)),
        "hot_hits": hot_hits,
        "cold_unique_rows": int(len(cold)),
        "carried_rows": int(len(carry_rows)),
        "read_rows": int(len(read_rows)),
        # rows a per-mini-batch loader with the same hot cache would fetch (no mega-batch dedup)
        "minibatch_cold_rows": int(sum(len(x) - int(np.count_nonzero(g < num_hot)) for x, g in zip(inputs, gather))),
    }
    return MegaBatchPlan(
        epoch=epoch,
        index=index,
        minibatches=mfgs,
        gather=list(gather),
        rows=np.concatenate([read_rows, carry_rows]).astype(np.int64),
        num_read=int(len(read_rows)),
        carry_src=carry_src,
        num_hot=num_hot,
        stats=stats,
    )


class Planner:
    """Samples and plans the mega-batches of one or more epochs (pure function of the seed).

    With `max_rows`, a group of M mini-batches whose buffer rows would exceed it is split
    in halves (recursively) so every plan fits a buffer of `max_rows` rows.
    """

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        train_idx: np.ndarray,
        config: PlanConfig,
        hot_rows: np.ndarray | None = None,
        max_rows: int | None = None,
    ):
        self.config = config
        self.train_idx = np.asarray(train_idx, dtype=np.int64)
        self.hot_rows = np.sort(np.asarray(hot_rows if hot_rows is not None else [], dtype=np.int64))
        self.sampler = NeighborSampler(indptr, indices, config.fanouts)
        self.max_rows = max_rows

    def plans(self, epochs: Iterable[int]) -> Iterator[MegaBatchPlan]:
        """Mega-batch plans in training order; carry-over continues across epochs."""
        cfg = self.config
        prev = None
        for epoch in epochs:
            batches = minibatch_seeds(self.train_idx, cfg, epoch)
            index = 0
            for start in range(0, len(batches), cfg.mega_batch):
                group = batches[start : start + cfg.mega_batch]
                ptr = np.concatenate([[0], np.cumsum([len(b) for b in group])])
                mfgs = self.sampler.sample_many(np.concatenate(group), ptr, cfg.seed, (epoch << 32) + start)
                for plan in self._fitting(mfgs, prev, epoch, index):
                    prev = plan
                    index += 1
                    yield plan

    def _fitting(self, mfgs: list[MFGs], prev: MegaBatchPlan | None, epoch: int, index: int) -> list[MegaBatchPlan]:
        plan = build_megabatch(mfgs, self.hot_rows, None if prev is None else prev.rows, epoch, index)
        if self.max_rows is None or len(plan.rows) <= self.max_rows:
            return [plan]
        if len(mfgs) == 1:
            raise ValueError(
                f"one mini-batch needs {len(plan.rows)} buffer rows beyond the hot cache, the buffer "
                f"holds {self.max_rows}: raise the memory budget or lower batch size or fanouts"
            )
        half = len(mfgs) // 2
        first = self._fitting(mfgs[:half], prev, epoch, index)
        return first + self._fitting(mfgs[half:], first[-1], epoch, index + len(first))


def save_plan(plan: MegaBatchPlan, path: str | Path) -> None:
    """One .npz per mega-batch plan; `load_plan` gives back an equal plan."""
    mb = plan.minibatches
    arrays = {
        "nodes": np.concatenate([m.nodes for m in mb]),
        "node_len": np.array([len(m.nodes) for m in mb], np.int64),
        "num_src": np.stack([m.num_src for m in mb]),
        "num_dst": np.stack([m.num_dst for m in mb]),
        "edge_ptr": np.stack([m.edge_ptr for m in mb]),
        "edge_src": np.concatenate([m.edge_src for m in mb]),
        "edge_dst": np.concatenate([m.edge_dst for m in mb]),
        "gather": np.concatenate(plan.gather),
        "rows": plan.rows,
        "carry_src": plan.carry_src,
        "meta": np.frombuffer(
            json.dumps(
                {"epoch": plan.epoch, "index": plan.index, "num_read": plan.num_read, "num_hot": plan.num_hot, "stats": plan.stats}
            ).encode(),
            np.uint8,
        ),
    }
    if plan.read is not None:
        arrays.update({f"read_{k}": v for k, v in plan.read.to_arrays().items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_plan(path: str | Path) -> MegaBatchPlan:
    with np.load(path) as z:
        a = {k: z[k] for k in z.files}
    meta = json.loads(a["meta"].tobytes().decode())
    node_off = np.concatenate([[0], np.cumsum(a["node_len"])])
    edge_off = np.concatenate([[0], np.cumsum(a["edge_ptr"][:, -1])])
    mfgs = [
        MFGs(
            nodes=a["nodes"][node_off[i] : node_off[i + 1]],
            num_src=a["num_src"][i],
            num_dst=a["num_dst"][i],
            edge_ptr=a["edge_ptr"][i],
            edge_src=a["edge_src"][edge_off[i] : edge_off[i + 1]],
            edge_dst=a["edge_dst"][edge_off[i] : edge_off[i + 1]],
        )
        for i in range(len(a["node_len"]))
    ]
    gather = np.split(a["gather"], np.cumsum([m.num_src[0] for m in mfgs])[:-1])
    read = {k[5:]: v for k, v in a.items() if k.startswith("read_")}
    return MegaBatchPlan(
        epoch=meta["epoch"],
        index=meta["index"],
        minibatches=mfgs,
        gather=list(gather),
        rows=a["rows"],
        carry_src=a["carry_src"],
        num_read=meta["num_read"],
        num_hot=meta["num_hot"],
        stats=meta["stats"],
        read=ReadPlan.from_arrays(read) if read else None,
    )
