"""`render_report` writes valid PNGs, with and without I/O counters, and names bad files."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from gnnssd.cli.report import render_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir: Path, io: bool, epochs: int = 4) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for e in range(1, epochs + 1):
        record = {"epoch": e, "train_loss": 2.0 / e, "train_acc": 0.2 * e, "epoch_s": 10.0 + e,
                  "stages_s": {"sample": 3.0, "gather": 1.5, "transfer": 0.1, "compute": 5.0},
                  "batches": 100}
        if e % 2 == 0:  # evaluated every other epoch
            record.update(valid_acc=0.15 * e, test_acc=0.14 * e)
        if io:
            record["io"] = {"bytes_read": 2**30 * e, "bytes_written": 0, "requests": 1000 * e}
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _check_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width, _ = matplotlib.image.imread(path).shape
    assert width >= 400 and height >= 300


@pytest.mark.parametrize("io", [True, False])
def test_report_writes_pngs(tmp_path: Path, io: bool) -> None:
    _write_run(tmp_path, io)
    paths = render_report(tmp_path)
    names = {p.name for p in paths}
    assert {"loss_accuracy.png", "stages.png"} <= names
    assert ("io_throughput.png" in names) == io
    for p in paths:
        assert p.parent == tmp_path / "report"
        _check_png(p)
    assert render_report(tmp_path) == paths  # re-rendering overwrites


def test_missing_metrics_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="metrics.jsonl: no metrics file"):
        render_report(tmp_path)


@pytest.mark.parametrize("content, problem", [
    ('{"epoch": 1, "train_loss": 1.0\n', "line 1: not valid JSON"),
    ('[1, 2]\n', "line 1: expected a JSON object"),
    ('{"epoch": 1, "train_loss": 1.0, "epoch_s": 2.0}\n', "line 1: missing key 'stages_s'"),
    ('{"epoch": 1, "train_loss": 1.0, "epoch_s": 2.0, "stages_s": {}, "io": 5}\n', "line 1: 'io'"),
    ("\n\n", "no records"),
])
def test_malformed_metrics_is_named(tmp_path: Path, content: str, problem: str) -> None:
    (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(RuntimeError) as err:
        render_report(tmp_path)
    assert str(tmp_path / "metrics.jsonl") in str(err.value) and problem in str(err.value)
