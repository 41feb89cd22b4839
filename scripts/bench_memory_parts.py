#!/usr/bin/env python3
"""What a training run's memory beyond `ssd.memory_budget` and the mapped topology is made
of, measured part by part while `gnnssd train` runs (issue 35, item 1).

The real Trainer of `--config` runs in this process; a thread looks at it every
`--interval` seconds: the process's RSS (/proc/self/status), the resident bytes of each
memory-mapped store file (/proc/self/smaps: the topology, perm.npy, inv.npy, labels.npy,
the rest), and the live objects of the ssd loader, each part's bytes: the labels held in
RAM, the planner's union (its slot map or hash table and unique rows) and the hot-row masks (every RowUnion and HotRows
alive), the mega-batch plans alive with their mini-batches (every MegaBatchPlan whose
blocks are in memory, arrays counted once; instances are tracked from their __init__), and the recycled x arrays. `runtime` is the
RSS after importing torch, DGL and gnnssd and running numba's kernels once, before the
store is opened. The table is the look at the peak RSS, and each part's largest value
over the run; `beyond` = RSS - memory_budget - topology (the issue's measure). A look
every second can miss a training step's peak (a step's RSS rises by its activations and
gradients), so the run's VmHWM is reported too, and in training each step's rise (see
StepMemory). Only this process is looked at, not the packer processes (ssd.packers): with
packers the planner's union is theirs; `--set ssd.packers=0` plans here.

    python scripts/bench_memory_parts.py --config datasets/configs/papers-mini.yaml \
        --set store=STORE --set run_dir=RUN [--epochs 1] [--loader-batches N]
        [--json bench_out/memory_parts.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np

MiB = 1 << 20
FILES = {"indptr.npy": "topology", "indices.npy": "topology", "perm.npy": "perm", "inv.npy": "inv",
         "labels.npy": "labels_mapped"}


def status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def mapped_files(store: Path) -> dict[str, int]:
    """Resident bytes of this process's mappings of the store's files, by part."""
    parts: dict[str, int] = {}
    kind = None
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=6)
            if "-" in first[0] and len(first) >= 5 and not first[0].endswith(":"):
                path = first[5].strip() if len(first) > 5 else ""
                kind = None
                if path.startswith(str(store)):
                    kind = FILES.get(Path(path).name, "other_store_files")
            elif kind is not None and line.startswith("Rss:"):
                parts[kind] = parts.get(kind, 0) + int(line.split()[1]) * 1024
    return parts


def _arrays(value, seen: set[int]) -> int:
    """Bytes of the distinct array buffers in `value` (arrays, lists, dicts, dataclasses)."""
    if isinstance(value, np.ndarray):
        base = value
        while isinstance(base.base, np.ndarray):
            base = base.base
        key = base.__array_interface__["data"][0]
        if key in seen:
            return 0
        seen.add(key)
        return base.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_arrays(v, seen) for v in value)
    if isinstance(value, dict):
        return sum(_arrays(v, seen) for v in value.values())
    if hasattr(value, "__dataclass_fields__"):
        return sum(_arrays(getattr(value, name), seen) for name in value.__dataclass_fields__)
    return 0


class Instances:
    """Weak references to the instances of a class made since `track` (some are unhashable
    dataclasses: a list, pruned as they die)."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []
        self.lock = threading.Lock()

    def add(self, obj) -> None:
        with self.lock:
            self.refs = [r for r in self.refs if r() is not None]
            self.refs.append(weakref.ref(obj))

    def alive(self) -> list:
        with self.lock:
            return [obj for obj in (r() for r in self.refs) if obj is not None]


def track_instances() -> dict[str, Instances]:
    """Every RowUnion, HotRows and MegaBatchPlan made from now on, held weakly (a look
    counts those alive; gc.get_objects from a second thread would disturb torch)."""
    from gnnssd.sampler import HotRows, MegaBatchPlan
    from gnnssd.sampler.plan import RowUnion

    made: dict[str, Instances] = {}
    for cls in (RowUnion, HotRows, MegaBatchPlan):
        made[cls.__name__] = instances = Instances()

        def init(self, *args, _init=cls.__init__, _instances=instances, **kwargs):
            _init(self, *args, **kwargs)
            _instances.add(self)

        cls.__init__ = init
    return made


def live_parts(source, made: dict[str, Instances]) -> dict[str, int]:
    """Bytes of the loader's parts that are alive now (see the module docstring)."""
    backend = source._backend
    parts = {"labels_held": 0, "slot_maps": 0, "hot_masks": 0, "plans_alive": 0, "plans_alive_count": 0,
             "x_pool": 0}
    labels = getattr(backend, "labels", None)
    values = getattr(labels, "values", None)
    if isinstance(values, np.ndarray):
        parts["labels_held"] = values.nbytes
    pool = getattr(getattr(backend, "buffers", None), "outputs", None)
    if pool is not None:
        parts["x_pool"] = sum(a.nbytes for a in list(pool._arrays))
    seen: set[int] = set()
    for union in made["RowUnion"].alive():  # its slot map (or hash table), unique rows and indices
        parts["slot_maps"] += _arrays([v for k, v in vars(union).items() if k not in ("hot", "members")], seen)
    for hot in made["HotRows"].alive():
        parts["hot_masks"] += _arrays(hot.bits if hasattr(hot, "bits") else hot.mask, seen)
    for plan in made["MegaBatchPlan"].alive():
        if plan.minibatches:
            parts["plans_alive"] += _arrays([plan.minibatches, plan.gather, plan.rows, plan.carry_src], seen)
            parts["plans_alive_count"] += 1
    return parts


def block_bytes(blocks) -> int:
    """Bytes of the index arrays of DGL blocks, every sparse format each has made (a block
    made from COO may add CSC for the forward and CSR for the backward)."""
    total = 0
    for block in blocks:
        formats = block.formats()
        for name in formats.get("created", []):
            arrays = block.adj_tensors(name)
            total += sum(a.numel() * a.element_size() for a in arrays if hasattr(a, "numel"))
    return total


class StepMemory:
    """What a training step adds, step by step: the RSS before the model runs (the loader's
    share and the mini-batch), the step's high-water mark above it (VmHWM, reset before each
    step through /proc/self/clear_refs), and at the step with the largest rise: the bytes
    of the tensors autograd saved for the backward pass (distinct storages, counted by a
    saved_tensors_hooks pack hook; x's own storage apart), of the mini-batch's x and of its
    DGL blocks' sparse formats after the forward and after the backward; per epoch, the
    largest RSS inside a training step (`step_peaks`) and inside its evaluation
    (`eval_peaks`, VmHWM reset before it). `peak()`: the process's VmHWM over the run (each
    reset reads it first)."""

    def __init__(self, trainer) -> None:
        import torch

        self.largest: dict[str, int] = {}
        self.steps = 0
        self.saved: dict[int, int] = {}
        self.now: dict[str, int] = {}
        self.blocks = None
        self.hwm = 0
        self.step_peaks = [0]  # per epoch: the largest RSS inside a training step
        self.eval_peaks: list[int] = []  # per epoch: the largest RSS inside its evaluation
        loss_of, step, evaluate = trainer._batch_loss, trainer.optimizer.step, trainer._evaluate_epoch

        def pack(tensor):
            storage = tensor.untyped_storage()
            self.saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        def batch_loss(batch):
            self.saved = {}
            before = self.reset()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                out = loss_of(batch)
            x = batch.x.values() if isinstance(batch.x, dict) else [batch.x]
            x_ptrs = {t.untyped_storage().data_ptr() for t in x}
            self.now = {"rss_before": before, "forward_rise": status("VmRSS:") - before,
                        "x": sum(t.untyped_storage().nbytes() for t in x),
                        "saved_for_backward": sum(n for ptr, n in self.saved.items() if ptr not in x_ptrs),
                        "x_saved_for_backward": int(any(ptr in x_ptrs for ptr in self.saved)),
                        "blocks_after_forward": block_bytes(batch.blocks)}
            self.blocks = batch.blocks  # until the step (the trainer holds the batch till then)
            return out

        def optimizer_step(*args, **kwargs):
            done = step(*args, **kwargs)
            self.step_peaks[-1] = max(self.step_peaks[-1], status("VmHWM:"))
            rise = status("VmHWM:") - self.now["rss_before"]
            self.now.update(rise=rise, blocks_after_backward=block_bytes(self.blocks))
            self.blocks = None
            self.steps += 1
            if rise > self.largest.get("rise", -1):
                self.largest = dict(self.now)
            return done

        def evaluate_epoch(*args, **kwargs):
            self.reset()
            done = evaluate(*args, **kwargs)
            self.eval_peaks.append(status("VmHWM:"))
            self.step_peaks.append(0)  # the next epoch's steps
            return done

        trainer._batch_loss = batch_loss
        trainer.optimizer.step = optimizer_step
        trainer._evaluate_epoch = evaluate_epoch

    def reset(self) -> int:
        """VmHWM := VmRSS (its peak so far kept in self.hwm); returns the RSS."""
        self.hwm = max(self.hwm, status("VmHWM:"))
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status("VmRSS:")

    def peak(self) -> int:
        return max(self.hwm, status("VmHWM:"))


class Watcher:
    """Looks at the process every `interval` seconds; keeps the look at the peak RSS and
    each part's largest value."""

    def __init__(self, source, made: dict[str, Instances], interval: float):
        self.source, self.made, self.interval = source, made, interval
        self.store = Path(source.store.path).resolve()
        self.peak: dict[str, int] = {}
        self.largest: dict[str, int] = {}
        self.looks = 0
        self.lock = threading.Lock()  # looks from the thread and from the loop
        self.stop = threading.Event()
        self.look()  # a first look at once, a last one at close: a short run has two
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def look(self) -> None:
        with self.lock:
            self._look()

    def _look(self) -> None:
        now = {"rss": status("VmRSS:"), **mapped_files(self.store), **live_parts(self.source, self.made)}
        self.looks += 1
        if now["rss"] > self.peak.get("rss", 0):
            self.peak = now
        for key, value in now.items():
            self.largest[key] = max(self.largest.get(key, 0), value)

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.look()
            except (RuntimeError, AttributeError):  # the trainer is closing
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.look()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--loader-batches", type=int, default=0,
                        help="instead of training: iterate the ssd loader alone over this many "
                             "training mini-batches (the config's sampler and budget)")
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    import torch  # noqa: F401  (the runtime's share: imports and compiled kernels)
    import dgl  # noqa: F401
    import yaml
    from gnnssd import Store
    from gnnssd.core import load_config, parse_bytes
    from gnnssd.sampler import PlanConfig, Planner
    from gnnssd.sampler.graphs import random_csc
    from gnnssd import NodeLoader
    from gnnssd.training import Trainer

    indptr, indices = random_csc(1000, 10, seed=0)
    list(Planner(indptr, indices, PlanConfig(fanouts=(3, 3), mega_batch=2)).plan_batches([np.arange(10)], 0))
    runtime = status("VmRSS:")

    made = track_instances()
    overrides = {k: yaml.safe_load(v) for k, v in (pair.split("=", 1) for pair in args.set)}
    overrides["train.epochs"] = args.epochs
    overrides["train.progress"] = False
    config = load_config(args.config, overrides)
    budget = parse_bytes(config.ssd.memory_budget)
    start = time.perf_counter()
    if args.loader_batches:  # the ssd loader alone over the config's training settings
        store = Store.open(config.store_path())
        seeds = np.random.default_rng(0).permutation(np.asarray(store.train_idx))
        loader = NodeLoader(store, seeds[:args.loader_batches * config.sampler.batch_size],
                            fanouts=config.sampler.fanouts, batch_size=config.sampler.batch_size, features="ssd",
                            memory_budget=config.ssd.memory_budget, packers=config.ssd.packers, seed=0,
                            device="cpu")
        watcher = Watcher(loader.source, made, args.interval)
        try:
            for mb in loader:
                float(mb.x.sum())
                watcher.look()  # also at every mini-batch (the stages live while it is held)
                del mb
            io = loader.io_stats()
        finally:
            watcher.close()
            loader.close()
    else:
        trainer = Trainer(config)
        store = trainer.store
        steps = StepMemory(trainer)
        watcher = Watcher(trainer.source, made, args.interval)
        try:
            io = trainer.fit()[-1].get("io", {})
        finally:
            watcher.close()
            trainer.close()
    seconds = time.perf_counter() - start
    peak = watcher.peak
    beyond = peak["rss"] - budget - peak.get("topology", 0)
    # the peak between looks: VmHWM (the topology at its largest resident share)
    hwm = status("VmHWM:") if args.loader_batches else steps.peak()
    hwm_beyond = hwm - budget - watcher.largest.get("topology", 0)
    rows = [("RSS at the peak look", peak["rss"]), ("ssd.memory_budget", budget),
            ("topology, mapped (resident)", peak.get("topology", 0)),
            ("beyond budget + topology", beyond),
            ("  runtime (torch, DGL, numba code; before the store)", runtime),
            ("  perm.npy, mapped (resident)", peak.get("perm", 0)),
            ("  inv.npy, mapped (resident)", peak.get("inv", 0)),
            ("  labels.npy, mapped (resident)", peak.get("labels_mapped", 0)),
            ("  labels held in RAM", peak["labels_held"]),
            ("  planner union (slot map or hash table, unique rows)", peak["slot_maps"]),
            ("  hot-row masks (row-sized)", peak["hot_masks"]),
            (f"  mega-batch plans alive ({peak['plans_alive_count']})", peak["plans_alive"]),
            ("  x pool (recycled x arrays)", peak["x_pool"])]
    listed = sum(value for _, value in rows[4:])
    rows.append(("  the rest (DGL blocks, model activations, queues, allocator)", beyond - listed))
    print(f"{store.num_nodes:,} nodes; {watcher.looks} looks over {seconds:.1f} s; MiB at the "
          f"peak look, and the largest over the run")
    print("| part | at peak | largest |\n|---|---|---|")
    keys = [None, None, "topology", None, None, "perm", "inv", "labels_mapped", "labels_held", "slot_maps",
            "hot_masks", "plans_alive", "x_pool", None]
    for (name, value), key in zip(rows, keys):
        largest = "" if key is None else f"{watcher.largest.get(key, 0) / MiB:,.1f}"
        print(f"| {name} | {value / MiB:,.1f} | {largest} |")
    print(f"peak RSS over the run (VmHWM) {hwm / MiB:,.1f} MiB: beyond budget + topology {hwm_beyond / MiB:,.1f} MiB")
    step_memory = {} if args.loader_batches else {"steps": steps.steps, **steps.largest,
                                                  "step_peaks": [p for p in steps.step_peaks if p],
                                                  "eval_peaks": steps.eval_peaks}
    if step_memory:
        print(f"the training step of the largest rise over its start ({steps.steps} steps; MiB):")
        print("| | MiB |\n|---|---|")
        for key in ("rss_before", "rise", "forward_rise", "saved_for_backward", "x", "blocks_after_forward",
                    "blocks_after_backward"):
            print(f"| {key} | {step_memory[key] / MiB:,.1f} |")
        print(f"x's own storage saved for the backward pass: {bool(step_memory['x_saved_for_backward'])}")
        for what, key in (("a training step", "step_peaks"), ("the evaluation", "eval_peaks")):
            print(f"largest RSS inside {what}, by epoch (beyond budget + topology), MiB: " + ", ".join(
                f"{p / MiB:,.1f} ({(p - budget - watcher.largest.get('topology', 0)) / MiB:,.1f})"
                for p in step_memory[key]))
    print(f"bytes read {io.get('bytes_read', 0) / MiB:,.1f} MiB, useful {io.get('useful_bytes', 0) / MiB:,.1f} MiB "
          f"(the last epoch's training mini-batches, or the loader's)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "config": args.config, "set": args.set, "epochs": args.epochs, "seconds": seconds,
            "num_nodes": store.num_nodes, "budget": budget, "runtime": runtime, "beyond": beyond,
            "vmhwm": hwm, "vmhwm_beyond": hwm_beyond,
            "peak": peak, "largest": watcher.largest, "looks": watcher.looks, "io": io,
            "step_memory": step_memory}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
