#!/usr/bin/env python3
"""The whole user path at scale, measured: preprocess, training epochs, evaluation,
prediction and embedding of a store larger than memory (the `papers` synthetic preset).

Every phase runs the real CLI (`gnnssd preprocess | train | eval | predict | embed`) as a
child process, sampled every second for its resident memory (the process tree's RSS, and
how much of it is the memory-mapped topology: the `Rss` of indptr.npy / indices.npy in
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
  gave (e.g. not enough free disk for the layer outputs), with its message.

    python scripts/bench_scale.py --config CONFIG [--preset papers --order degree]
        [--epochs 2] [--phases preprocess train eval predict embed] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

PHASES = ("preprocess", "train", "eval", "predict", "embed")
TOPOLOGY_FILES = ("indptr.npy", "indices.npy")
GiB = 1 << 30


class MemorySampler:
    """Samples a process tree's RSS (and the mapped topology's share of it) every
    `interval` seconds from a background thread; `peak()` since the last `reset()`."""

    def __init__(self, pid: int, interval: float = 1.0):
        self.process = psutil.Process(pid)
        self.interval = interval
        self.lock = threading.Lock()
        self.samples: list[tuple[float, int, int]] = []  # (time, rss, topology rss)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                procs = [self.process, *self.process.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in procs)
                topo = sum(_mapped_rss(p.pid) for p in procs)
            except psutil.Error:
                continue
            with self.lock:
                self.samples.append((time.time(), rss, topo))

    def window(self, start: float, end: float) -> dict[str, float]:
        """Peak RSS, and the topology's resident bytes at that moment and at most, between
        two times."""
        with self.lock:
            inside = [s for s in self.samples if start <= s[0] <= end] or self.samples[-1:]
        if not inside:
            return {}
        peak = max(inside, key=lambda s: s[1])
        return {"peak_rss_gib": round(peak[1] / GiB, 3), "topology_rss_at_peak_gib": round(peak[2] / GiB, 3),
                "topology_rss_max_gib": round(max(s[2] for s in inside) / GiB, 3)}

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _mapped_rss(pid: int) -> int:
    """Resident bytes of the process's mappings of the topology files."""
    total, inside = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    inside = line.rstrip().endswith(TOPOLOGY_FILES)
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def run(cmd: list[str], log: Path) -> dict[str, Any]:
    """Run one CLI command, sampling its memory; wall time, exit code, peak RSS, the
    output's last lines (the error a refusal prints)."""
    start = time.time()
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        sampler = MemorySampler(child.pid)
        code = child.wait()
        sampler.close()
    tail = log.read_text(errors="replace").splitlines()[-3:]
    return {"cmd": " ".join(cmd), "exit_code": code, "wall_s": round(time.time() - start, 1),
            **sampler.window(start, time.time()), "last_lines": tail, "_sampler": sampler,
            "_start": start}


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


def _public(outcome: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in outcome.items() if not k.startswith("_")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="training config (store and run_dir in it)")
    p.add_argument("--preset", help="synthetic preset to preprocess when the store is missing")
    p.add_argument("--order", default="degree")
    p.add_argument("--memory-limit", help="preprocess --memory-limit (default: its own)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--embed-layer", type=int, help="embed --layer (default: the last)")
    p.add_argument("--json", type=Path, default=Path("bench_out/bench_scale.json"))
    args = p.parse_args()
    cfg = yaml.safe_load(args.config.read_text())
    store = (args.config.parent / cfg["store"]).resolve()
    run_dir = (args.config.parent / cfg["run_dir"]).resolve()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    log = args.json.with_suffix(".log")
    results: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    results.setdefault("config", cfg)
    out_dir = args.json.parent
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
