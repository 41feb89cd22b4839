#!/usr/bin/env python3
"""The whole user path at scale, measured: preprocess, training epochs, evaluation,
prediction and embedding of a store larger than memory (the `papers` synthetic preset).

Every phase runs the real CLI (`gnnssd preprocess | train | eval | predict | embed`) as a
child process, sampled every second for its resident memory (the process tree's RSS, and
how much of it is the memory-mapped topology: the `Rss` of indptr.npy / indices.npy / etypes.npy in
/proc/PID/smaps). Results go to --json after every phase, so a run stopped by a time limit
keeps what it measured, and a phase already in the JSON is skipped when the script is run
again (training resumes from its checkpoint with --resume).

- preprocess: per step (topology, order, renumber, features, page checksums, arrays) wall
  and CPU seconds, peak RSS and bytes written, from the manifest's `preprocess_steps`
  (written by the run that made the store), plus the whole command's time and peak RSS
  when this script ran it;
- train: per epoch the time, mini-batches/s, bytes read / useful bytes, stage times,
  accuracy, and the peak RSS while that epoch ran (with the topology's resident pages);
- eval / predict --layerwise / embed: wall time and peak RSS, or the refusal a command
  gave (e.g. not enough free disk for the layer outputs), with its message;
- compare: the first --compare-batches training mini-batches of epoch 1, end to end
  (forward, backward, step of the config's model), for four ways to feed them, each in its
  own process: `gnnssd` (NodeLoader, features: ssd, the config's budget), `per-row` (an LRU
  cache of the budget, each missing row read as its own O_DIRECT page through the
  io_engine: GraphBolt's and Ginex's design), `mmap` (the features memmap, with the page
  cache held to the budget plus --headroom by bench_train's memory holder: what a DGL user
  tries first) and `compute-only` (rows gathered from a table in RAM: the limit where I/O
  costs nothing). The baselines sample with gnnssd's sampler (DGL's would need the
  topology as int64 tensors: 19 GiB at papers scale), the same seed batches as gnnssd;
- interrupt: `gnnssd train` (resumed if the run has a checkpoint) sent SIGINT after
  --interrupt-after seconds, as Ctrl-C would: the seconds until it exits, its exit code and
  message, the checkpoint unchanged (size and bytes' hash before and after), the scratch it
  left (the run directory's .gnnssd-scratch, the temp directory's gnnssd-scratch-*), and
  the RSS breakdown while it trained (budget, mapped topology, the rest).

--cgroup-memory SIZE runs every child inside a fresh cgroup v1 memory group limited to SIZE
(as root; its peak usage, failcnt and OOM kills recorded): a hard limit below features +
topology that the page cache cannot exceed either, without a memory holder.

    python scripts/bench_scale.py --config CONFIG [--preset papers --order degree]
        [--epochs 2] [--phases preprocess train eval predict embed compare] [--json PATH]
        [--compare-batches 100] [--compare-systems gnnssd per-row mmap compute-only]
        [--interrupt-after 600] [--cgroup-memory 12GiB]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import yaml

PHASES = ("preprocess", "train", "eval", "predict", "embed", "compare", "interrupt")
SYSTEMS = ("compute-only", "gnnssd", "per-row", "mmap")
#: Rows of the compute-only table (float32): what the gather indexes instead of the file.
TABLE_ROWS = 1 << 20
TOPOLOGY_FILES = ("indptr.npy", "indices.npy", "etypes.npy")  # etypes: a typed store's relations
GiB = 1 << 30


class MemorySampler:
    """Samples a process tree's RSS (and the mapped topology's share of it) every
    `interval` seconds from a background thread; `peak()` since the last `reset()`."""

    def __init__(self, pid: int, interval: float = 1.0):
        self.process = psutil.Process(pid)
        self.interval = interval
        self.lock = threading.Lock()
        self.samples: list[tuple[float, int, int, int]] = []  # (time, rss, topology, other files)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                procs = [self.process, *self.process.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in procs)
                mapped = [_mapped_rss(p.pid) for p in procs]
            except psutil.Error:
                continue
            with self.lock:
                self.samples.append((time.time(), rss, sum(m[0] for m in mapped), sum(m[1] for m in mapped)))

    def window(self, start: float, end: float) -> dict[str, float]:
        """Peak RSS, and the topology's resident bytes at that moment and at most, between
        two times; at the peak also the other file mappings' share (store arrays, libraries)
        and the rest (anonymous memory: what the budget bounds, plus the process's own)."""
        with self.lock:
            inside = [s for s in self.samples if start <= s[0] <= end] or self.samples[-1:]
        if not inside:
            return {}
        peak = max(inside, key=lambda s: s[1])
        return {"peak_rss_gib": round(peak[1] / GiB, 3), "topology_rss_at_peak_gib": round(peak[2] / GiB, 3),
                "topology_rss_max_gib": round(max(s[2] for s in inside) / GiB, 3),
                "other_files_rss_at_peak_gib": round(peak[3] / GiB, 3),
                "anonymous_at_peak_gib": round((peak[1] - peak[2] - peak[3]) / GiB, 3)}

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _mapped_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of the process's mappings of the topology files, and of its other
    file mappings."""
    topology, other, kind = 0, 0, None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    fields = line.split()
                    named = len(fields) >= 6 and fields[5].startswith("/")
                    kind = "topology" if line.rstrip().endswith(TOPOLOGY_FILES) else "other" if named else None
                elif kind and line.startswith("Rss:"):
                    size = int(line.split()[1]) * 1024
                    topology, other = (topology + size, other) if kind == "topology" else (topology, other + size)
    except OSError:
        return 0, 0
    return topology, other


class MemoryGroup:
    """A cgroup v1 memory group, child of this process's own, limited to `limit` bytes:
    the children started with `enter` as their preexec_fn run under it (their page cache
    included)."""

    def __init__(self, limit: int):
        own = next(line.split(":", 2)[2].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.split(":")[1] == "memory")
        self.path = Path("/sys/fs/cgroup/memory") / own.lstrip("/") / f"gnnssd-bench-{os.getpid()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        self.limit = limit

    def enter(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def describe(self) -> dict[str, Any]:
        oom = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return {"limit_gib": round(self.limit / GiB, 3),
                "max_usage_gib": round(int((self.path / "memory.max_usage_in_bytes").read_text()) / GiB, 3),
                "failcnt": int((self.path / "memory.failcnt").read_text()),
                "oom_kills": int(oom.get("oom_kill", 0))}

    def reset_peak(self) -> None:
        (self.path / "memory.max_usage_in_bytes").write_text("0")

    def close(self) -> None:
        self.path.rmdir()


#: The memory group every child runs in (--cgroup-memory), or None.
GROUP: MemoryGroup | None = None


def _child_setup() -> None:
    """In the child before exec: SIGINT back to its default (a script started in the
    background, e.g. with nohup, passes SIGINT on ignored, and Python then installs no
    KeyboardInterrupt handler: the interrupt phase's Ctrl-C would never arrive), and into
    the memory group."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if GROUP:
        GROUP.enter()


def run(cmd: list[str], log: Path, interrupt_after: float | None = None,
        started: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    """Run one CLI command, sampling its memory; wall time, exit code, peak RSS, the
    output's last lines (the error a refusal prints). With `interrupt_after`, SIGINT is
    sent that many seconds after `started()` first holds (polled; imports can take a
    minute on a busy machine) and the exit is timed from it."""
    start = time.time()
    if GROUP:
        GROUP.reset_peak()
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_child_setup)
        sampler = MemorySampler(child.pid)
        interrupted = None
        if interrupt_after is not None:
            while child.poll() is None and not started():
                time.sleep(0.2)
            try:
                code = child.wait(timeout=interrupt_after)
            except subprocess.TimeoutExpired:
                interrupted = time.time()
                child.send_signal(signal.SIGINT)
                code = child.wait()
        else:
            code = child.wait()
        sampler.close()
    end = time.time()
    tail = log.read_text(errors="replace").splitlines()[-3:]
    return {"cmd": " ".join(cmd), "exit_code": code, "wall_s": round(end - start, 1),
            **sampler.window(start, interrupted or end), "last_lines": tail, "_sampler": sampler,
            "_start": start, "_pid": child.pid, **({"cgroup": GROUP.describe()} if GROUP else {}),
            **({"exit_after_sigint_s": round(end - interrupted, 2)} if interrupted else {})}


def gnnssd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gnnssd", *args]


def preprocess_phase(args: argparse.Namespace, store: Path, log: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if not (store / "manifest.json").exists():
        if not args.preset:
            raise SystemExit(f"{store}: no store there; give --preset to make it")
        cmd = gnnssd("preprocess", "synthetic", "--preset", args.preset, "--order", args.order,
                     "--out", str(store), *(["--memory-limit", args.memory_limit] if args.memory_limit else []))
        result = _public(run(cmd, log))
    manifest = json.loads((store / "manifest.json").read_text())
    result["steps"] = manifest.get("preprocess_steps", {})
    result["store"] = {"nodes": manifest["num_nodes"], "edges": manifest["num_edges"],
                       "feature_dtype": manifest["features"]["dtype"], "feature_dim": manifest["features"]["dim"],
                       "bytes": sum(p.stat().st_size for p in store.iterdir())}
    return result


def train_phase(args: argparse.Namespace, run_dir: Path, log: Path) -> dict[str, Any]:
    metrics = run_dir / "metrics.jsonl"
    resume = ["--resume"] if (run_dir / "checkpoint.pt").exists() else []
    seen = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    cmd = gnnssd("train", "--config", str(args.config), "--set", f"train.epochs={args.epochs}",
                 "--set", "train.progress=false", *resume)
    marks: list[float] = []

    def watch(stop: threading.Event) -> None:  # the time each new metrics line appears
        count = seen
        while not stop.wait(0.5):
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            while len(lines) > count:
                marks.append(time.time())
                count += 1

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
    watcher.start()
    outcome = run(cmd, log)
    stop.set()
    watcher.join()
    sampler, start = outcome.pop("_sampler"), outcome.pop("_start")
    epochs = []
    bounds = [start, *marks]
    for k, line in enumerate(metrics.read_text().splitlines()[seen:] if metrics.exists() else []):
        m = json.loads(line)
        io = m.get("io", {})
        epoch = {"epoch": m["epoch"], "epoch_s": m.get("epoch_s"), "batches": m.get("batches"),
                 "batches_per_s": round(m["batches"] / m["epoch_s"], 3) if m.get("epoch_s") else None,
                 "bytes_read": io.get("bytes_read"), "useful_bytes": io.get("useful_bytes"),
                 "read_amplification": round(io["bytes_read"] / io["useful_bytes"], 3)
                 if io.get("useful_bytes") else None,
                 "stages_s": m.get("stages_s"), "train_loss": m.get("train_loss"),
                 "train_acc": m.get("train_acc"), "valid_acc": m.get("valid_acc"), "test_acc": m.get("test_acc"),
                 "eval_s": m.get("eval_s")}
        if k + 1 < len(bounds):
            epoch.update(sampler.window(bounds[k], bounds[k + 1]))
        epochs.append(epoch)
    return {**outcome, "resumed": bool(resume), "epochs": epochs}


def _digest(path: Path) -> str | None:
    if not path.exists():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"{path.stat().st_size} B sha256 {h.hexdigest()[:16]}"


def _run_scratch(run_dir: Path) -> set[str]:
    inside = run_dir / ".gnnssd-scratch"
    return {str(p) for p in inside.iterdir()} if inside.exists() else set()


def _scratch_left(run_dir: Path, pid: int) -> set[str]:
    """Scratch folders of process `pid`: the run directory's and the temp directory's."""
    own = Path(tempfile.gettempdir()).glob(f"gnnssd-scratch-{pid}-*")
    return {p for p in _run_scratch(run_dir) if Path(p).name.startswith(f"{pid}-")} | {str(p) for p in own}


def interrupt_phase(args: argparse.Namespace, run_dir: Path, log: Path) -> dict[str, Any]:
    """`gnnssd train` stopped by SIGINT (Ctrl-C) --interrupt-after seconds after its trainer
    started (made its scratch folder in the run directory)."""
    checkpoint = run_dir / "checkpoint.pt"
    before, stale = _digest(checkpoint), _run_scratch(run_dir)
    resume = ["--resume"] if checkpoint.exists() else []
    cmd = gnnssd("train", "--config", str(args.config), "--set", f"train.epochs={args.epochs}",
                 "--set", "train.progress=false", *resume)
    outcome = run(cmd, log, interrupt_after=args.interrupt_after,
                  started=lambda: bool(_run_scratch(run_dir) - stale))
    return {**_public(outcome), "resumed": bool(resume), "checkpoint_before": before,
            "checkpoint_after": _digest(checkpoint),
            "scratch_left": sorted(_scratch_left(run_dir, outcome["_pid"]))}


def _public(outcome: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in outcome.items() if not k.startswith("_")}


# --- compare: the same mini-batches fed four ways ----------------------------------------

def compare_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One system over the first `batches` mini-batches, in this fresh process."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from gnnssd import NodeLoader
    from gnnssd.core.config import load_config
    from gnnssd.core.runtime import seed_everything
    from gnnssd.models.builtin import build_model
    from gnnssd.sampler import NeighborSampler, Shuffled, seed_batches
    from gnnssd.sampler.blocks import to_dgl_blocks
    from gnnssd.storage_format import Store

    cfg = load_config(spec["config"])
    store = Store.open(cfg.store_path())
    seed_everything(cfg.seed)
    budget = cfg.ssd.memory_budget
    fanouts, batch_size = list(cfg.sampler.fanouts), cfg.sampler.batch_size
    # store IDs: the sampler and the files speak them; NodeLoader takes the dataset's IDs
    batches = seed_batches(np.asarray(store.train_store_ids), batch_size, Shuffled(), cfg.seed, 1)[:spec["batches"]]
    labels = np.load(cfg.store_path() / "labels.npy", mmap_mode="r")
    model = build_model(cfg.model, store.feat_dim, store.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    stages = {"sample": 0.0, "features": 0.0, "compute": 0.0}

    def step(blocks: list, x: torch.Tensor, y: torch.Tensor) -> None:
        t = time.perf_counter()
        loss = F.cross_entropy(model(blocks, x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stages["compute"] += time.perf_counter() - t

    start = time.perf_counter()
    if spec["system"] == "gnnssd":
        seeds = store.original_ids(np.concatenate(batches))
        with NodeLoader(store, seeds, fanouts=fanouts, batch_size=batch_size, features="ssd",
                        memory_budget=budget, shuffle=False, seed=cfg.seed, device="cpu",
                        eval_fanouts=fanouts, eval_batch_size=batch_size) as loader:
            start = time.perf_counter()  # the hot cache is loaded: setup, as for the others
            for mb in loader:
                step(mb.blocks, mb.x, mb.y)
            io = loader.io_stats()
        stages = {**stages, **{k: round(v, 3) for k, v in loader.timer.take().items()}}
    else:
        rows_of = _feature_source(spec["system"], store, budget)
        sampler = NeighborSampler(store.indptr, store.indices, fanouts)
        io = {}
        start = time.perf_counter()
        for k, seeds in enumerate(batches):
            t = time.perf_counter()
            mfgs = sampler.sample(np.sort(seeds), cfg.seed, k)
            blocks = to_dgl_blocks(mfgs)
            t2 = time.perf_counter()
            x = rows_of(np.asarray(mfgs.nodes))
            t3 = time.perf_counter()
            stages["sample"] += t2 - t
            stages["features"] += t3 - t2
            y = torch.from_numpy(np.asarray(labels[mfgs.nodes[:int(mfgs.num_dst[-1])]], dtype=np.int64))
            step(blocks, x, y)
        io = getattr(rows_of, "io", dict)()
    seconds = time.perf_counter() - start
    import resource
    return {"system": spec["system"], "batches": len(batches), "seconds": round(seconds, 2),
            "s_per_batch": round(seconds / len(batches), 3),
            "stages_s": {k: round(v, 2) for k, v in stages.items()}, "io": io,
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def _feature_source(system: str, store: Any, budget: int) -> Any:
    """rows(ids) -> float32 tensor of the ids' features, for the baselines."""
    import numpy as np
    import torch

    if system == "compute-only":
        table = np.random.default_rng(0).standard_normal((TABLE_ROWS, store.feat_dim), dtype=np.float32)
        return lambda ids: torch.from_numpy(table[ids % TABLE_ROWS])
    if system == "mmap":
        features = store.features_memmap()
        return lambda ids: torch.from_numpy(store.as_float32(features[np.sort(ids)][np.argsort(np.argsort(ids))], ids))
    from gnnssd.core.timing import StageTimer
    from gnnssd.loading.backends.baselines import LRUCache, PageReads
    from gnnssd.loading.types import IOCounters

    counters = IOCounters()
    cache = LRUCache(PageReads(store, counters, StageTimer()), budget // store.row_bytes, store.num_nodes)

    def rows(ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(store.as_float32(cache.read(ids), ids))

    rows.io = counters.as_dict  # type: ignore[attr-defined]
    return rows


def compare_phase(args: argparse.Namespace, log: Path) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_train import PageCacheLimit, drop_caches

    from gnnssd.core.budget import parse_bytes

    cfg = yaml.safe_load(args.config.read_text())
    budget = parse_bytes(cfg.get("ssd", {}).get("memory_budget", "1GiB"))
    rows = []
    for system in args.compare_systems:
        dropped = drop_caches()
        spec = json.dumps({"system": system, "config": str(args.config), "batches": args.compare_batches})
        cmd = [sys.executable, __file__, "--config", str(args.config), "--child", spec]
        if GROUP:  # every system under the same hard limit, page cache included
            outcome, held = run(cmd, log), f"cgroup {GROUP.limit / GiB:.3g} GiB"
        elif system == "mmap":
            with PageCacheLimit(budget + parse_bytes(args.headroom)) as limit:
                outcome = run(cmd, log)
            held = limit.describe()
        else:
            outcome, held = run(cmd, log), "no limit"
        outcome.pop("_sampler"), outcome.pop("_start"), outcome.pop("_pid")
        lines = [x for x in log.read_text().splitlines() if x.startswith("{\"system\"")]
        row = json.loads(lines[-1]) if outcome["exit_code"] == 0 and lines else {"system": system}
        rows.append({**row, "exit_code": outcome["exit_code"], "page_cache": held, "caches": dropped,
                     "sampled_peak_rss_gib": outcome.get("peak_rss_gib"), "cgroup": outcome.get("cgroup"),
                     **{k: outcome.get(k) for k in ("topology_rss_at_peak_gib", "other_files_rss_at_peak_gib",
                                                    "anonymous_at_peak_gib")}})
        print(json.dumps(rows[-1]), flush=True)
    base = {r["system"]: r.get("s_per_batch") for r in rows}
    ratios = {}
    if base.get("gnnssd"):
        for other in ("compute-only", "per-row", "mmap"):
            if base.get(other):
                ratios[f"gnnssd / {other} time"] = round(base["gnnssd"] / base[other], 3)
    return {"budget_bytes": budget, "rows": rows, "ratios": ratios}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="training config (store and run_dir in it)")
    p.add_argument("--preset", help="synthetic preset to preprocess when the store is missing")
    p.add_argument("--order", default="degree")
    p.add_argument("--memory-limit", help="preprocess --memory-limit (default: its own)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--phases", nargs="+", choices=PHASES, default=[p for p in PHASES if p != "interrupt"])
    p.add_argument("--embed-layer", type=int, help="embed --layer (default: the last)")
    p.add_argument("--compare-batches", type=int, default=100)
    p.add_argument("--compare-systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--headroom", default="1.5GiB", help="memory beside the budget for mmap's process")
    p.add_argument("--interrupt-after", type=float, default=600.0,
                   help="interrupt: seconds of training before SIGINT")
    p.add_argument("--cgroup-memory", help="run the children in a cgroup v1 memory group of this size (root)")
    p.add_argument("--json", type=Path, default=Path("bench_out/bench_scale.json"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(compare_child(json.loads(args.child))), flush=True)
        return 0
    cfg = yaml.safe_load(args.config.read_text())
    store = (args.config.parent / cfg["store"]).resolve()
    run_dir = (args.config.parent / cfg["run_dir"]).resolve()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    log = args.json.with_suffix(".log")
    results: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    results.setdefault("config", cfg)
    out_dir = args.json.parent
    global GROUP
    if args.cgroup_memory:
        from gnnssd.core.budget import parse_bytes
        GROUP = MemoryGroup(parse_bytes(args.cgroup_memory))
    try:
        return _run_phases(args, results, store, run_dir, log, out_dir)
    finally:
        if GROUP:
            GROUP.close()


def _run_phases(args: argparse.Namespace, results: dict[str, Any], store: Path, run_dir: Path,
                log: Path, out_dir: Path) -> int:
    for phase in args.phases:
        if phase in results and results[phase].get("exit_code", 0) == 0 and phase != "train":
            print(f"{phase}: in {args.json} already")
            continue
        print(f"--- {phase}", flush=True)
        if phase == "preprocess":
            results[phase] = preprocess_phase(args, store, log)
        elif phase == "train":
            previous = results.get("train", {}).get("epochs", [])
            done = {e["epoch"] for e in previous}
            if len(done) >= args.epochs:
                print(f"train: {len(done)} epochs in {args.json} already")
                continue
            outcome = train_phase(args, run_dir, log)
            outcome["epochs"] = [e for e in previous if e["epoch"] not in {x["epoch"] for x in outcome["epochs"]}] \
                + outcome["epochs"]
            results[phase] = _public(outcome)
        elif phase == "eval":
            results[phase] = _public(run(gnnssd("eval", "--config", str(args.config)), log))
        elif phase == "predict":
            results[phase] = _public(run(gnnssd("predict", "--config", str(args.config), "--layerwise",
                                                "--out", str(out_dir / "scale_predictions.npy")), log))
        elif phase == "compare":
            results[phase] = compare_phase(args, log)
        elif phase == "interrupt":
            results[phase] = interrupt_phase(args, run_dir, log)
        elif phase == "embed":
            layer = ["--layer", str(args.embed_layer)] if args.embed_layer else []
            results[phase] = _public(run(gnnssd("embed", "--config", str(args.config), *layer,
                                                "--out", str(out_dir / "scale_embeddings.npy")), log))
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps({k: v for k, v in results[phase].items() if k != "epochs"}, indent=1)[:2000])
        for epoch in results[phase].get("epochs", []):
            print(f"epoch {epoch['epoch']}: {epoch.get('epoch_s')} s, {epoch.get('batches_per_s')} "
                  f"mini-batches/s, amplification {epoch.get('read_amplification')}, peak RSS "
                  f"{epoch.get('peak_rss_gib')} GiB (topology {epoch.get('topology_rss_at_peak_gib')}), "
                  f"valid {epoch.get('valid_acc')}, test {epoch.get('test_acc')}")
    # a refusal of eval/predict/embed is a result (e.g. no disk for the layer outputs);
    # preprocess or training that failed is not
    failed = [p for p in ("preprocess", "train") if results.get(p, {}).get("exit_code", 0)]
    if failed:
        print(f"failed: {failed} (see {log})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
