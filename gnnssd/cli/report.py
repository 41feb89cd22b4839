"""`gnnssd report RUN_DIR`: a run's metrics.jsonl as PNG plots, for looking instead of reading.

Plots (in RUN_DIR/report/): loss and accuracy per epoch; the per-epoch stage breakdown
(foreground stages stacked, with the time no stage accounts for as "other", and the ssd
pipeline's background stages beside them); and, when the records carry
I/O counters (`io`: {"bytes_read", "bytes_written", "requests"} per epoch), the read
throughput over the run's time. Figures are drawn with matplotlib's Agg canvas directly,
so nothing touches pyplot's global backend or needs a display.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gnnssd.storage_format import SmallFileError, atomic_file, read_small_text, shown
from gnnssd.training import METRICS

METRICS_BYTES = 1 << 30

log = logging.getLogger("gnnssd.cli.report")

MAX_EPOCH = 10**6  # far past any run; a larger epoch is a damaged or forged record
REQUIRED = ("epoch", "train_loss", "epoch_s", "stages_s")
ACCURACIES = ("train_acc", "valid_acc", "test_acc")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, sorted by epoch (the last record of an epoch wins);
    RuntimeError naming the file and line for anything missing or malformed."""
    if not path.is_file():
        raise RuntimeError(f"{path}: no metrics file (has this run trained an epoch?)")
    by_epoch: dict[int, dict[str, Any]] = {}
    try:
        text = read_small_text(path, METRICS_BYTES, "metrics log (JSON lines)")
    except SmallFileError as exc:
        raise RuntimeError(str(exc)) from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RuntimeError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise RuntimeError(f"{where}: expected a JSON object, got {type(record).__name__}")
        missing = [key for key in REQUIRED if key not in record]
        if missing:
            raise RuntimeError(f"{where}: missing key {missing[0]!r} (records need {list(REQUIRED)})")
        if not isinstance(record["stages_s"], dict):
            raise RuntimeError(f"{where}: 'stages_s' must be an object of stage -> seconds")
        if "io" in record and not (isinstance(record["io"], dict) and "bytes_read" in record["io"]):
            raise RuntimeError(f"{where}: 'io' must be an object with 'bytes_read'")
        epoch = record["epoch"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
            raise RuntimeError(f"{where}: 'epoch' is {shown(epoch, 100)}, expected an integer from 0 to {MAX_EPOCH:,}")
        for key in ("train_loss", "epoch_s", *ACCURACIES):
            value = record.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RuntimeError(f"{where}: {key!r} is {shown(value, 100)}, expected a number")
            # NaN: the accuracy of an empty split (the trainer writes it); nothing else
            if math.isinf(value) or math.isnan(value) and key not in ACCURACIES:
                raise RuntimeError(f"{where}: {key!r} is {value}, expected a finite number")
        by_epoch[epoch] = record
    if not by_epoch:
        raise RuntimeError(f"{path}: no records")
    return [by_epoch[e] for e in sorted(by_epoch)]


def render_report(run_dir: str | Path) -> list[Path]:
    """Write the PNGs into RUN_DIR/report/ and return their paths (the I/O plot only when
    every record has I/O counters; its absence is logged)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / METRICS)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    written = [_save(_loss_accuracy(records), out / "loss_accuracy.png"),
               _save(_stages(records), out / "stages.png")]
    if all("io" in r for r in records):
        written.append(_save(_io_throughput(records), out / "io_throughput.png"))
    else:
        log.info("%s: no I/O counters in the records (features: memory reads none while "
                 "training); io_throughput.png skipped", run_dir / METRICS)
    return written


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    with atomic_file(path) as f:
        fig.savefig(f, dpi=100, format="png")
    return path


def _loss_accuracy(records: list[dict[str, Any]]) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    epochs = [r["epoch"] for r in records]
    loss_ax.plot(epochs, [r["train_loss"] for r in records], marker="o")
    loss_ax.set(title="training loss", xlabel="epoch", ylabel="cross-entropy")
    for key in ACCURACIES:  # valid/test exist only on evaluated epochs
        points = [(r["epoch"], r[key]) for r in records if key in r]
        if points:
            acc_ax.plot(*zip(*points), marker="o", label=key.removesuffix("_acc"))
    acc_ax.set(title="accuracy", xlabel="epoch", ylabel="accuracy")
    acc_ax.legend()
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    return fig


# Stages that run in background threads of the ssd pipeline, overlapping the others.
BACKGROUND = ("plan", "repack", "read")


def _stages(records: list[dict[str, Any]]) -> Figure:
    """Foreground stages stacked (they add up to the epoch, the rest is "other");
    background stages, which overlap them, as bars of their own beside each epoch."""
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    epochs = [r["epoch"] for r in records]
    names: list[str] = []
    for r in records:  # stages in order of first appearance
        names += [k for k in r["stages_s"] if k not in names]
    foreground = [n for n in names if n not in BACKGROUND]
    background = [n for n in names if n in BACKGROUND]
    width = 0.4 if background else 0.8
    left = [e - width / 2 if background else e for e in epochs]
    bottom = [0.0] * len(records)
    for name in foreground:
        heights = [float(r["stages_s"].get(name, 0.0)) for r in records]
        ax.bar(left, heights, width, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    other = [max(0.0, r["epoch_s"] - b) for r, b in zip(records, bottom)]
    if any(other):
        ax.bar(left, other, width, bottom=bottom, label="other", color="lightgrey")
    bottom = [0.0] * len(records)
    for name in background:
        heights = [float(r["stages_s"].get(name, 0.0)) for r in records]
        ax.bar([e + width / 2 for e in epochs], heights, width, bottom=bottom, hatch="//",
               alpha=0.6, label=f"{name} (background)")
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set(title="time per epoch by stage (hatched: overlapped background work)",
           xlabel="epoch", ylabel="seconds")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    return fig


def _io_throughput(records: list[dict[str, Any]]) -> Figure:
    """Read throughput of each epoch, drawn over the run's training time (epochs back to
    back, evaluation not counted)."""
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    ends, t = [0.0], 0.0
    for r in records:
        t += r["epoch_s"]
        ends.append(t)
    rates = [r["io"]["bytes_read"] / r["epoch_s"] / 2**20 if r["epoch_s"] > 0 else 0.0
             for r in records]
    ax.stairs(rates, ends, fill=True, alpha=0.5)
    ax.set(title="feature reads", xlabel="training time (s)", ylabel="MiB/s read")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return fig
