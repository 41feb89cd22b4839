"""The command line, end to end in subprocesses, as a user runs it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO


def gnnssd(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "gnnssd", *map(str, args)], cwd=REPO,
                            capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"gnnssd {' '.join(map(str, args))} failed:\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def cora_run(tmp_path_factory, planetoid_root):
    folder = tmp_path_factory.mktemp("cli")
    gnnssd("preprocess", "planetoid", "--root", planetoid_root, "--name", "cora",
           "--out", folder / "cora", "--order", "degree")
    config = folder / "cora.yaml"
    config.write_text("store: cora\nrun_dir: run\nseed: 1\n"
                      "model: {name: gcn, hidden: 32}\n"
                      "sampler: {fanouts: [10, 10], batch_size: 140}\n"
                      "train: {epochs: 3, lr: 0.01, progress: false}\n")
    return folder, config


def test_info_and_verify(cora_run):
    folder, _ = cora_run
    info = gnnssd("info", folder / "cora").stdout
    assert "nodes        2,708" in info and "node order   degree" in info
    assert "all 10 files match their checksums, and every page" in gnnssd("verify", folder / "cora").stdout


def test_calibrate_writes_the_drive_model(cora_run):
    folder, _ = cora_run
    out = gnnssd("calibrate", folder / "cora", "--seconds", "0.2").stdout
    model = json.loads((folder / "cora" / "calibration.json").read_text())
    assert model["model"]["read_bw"] > 0 and model["model"]["request_s"] > 0 and "CostModel" in out


def test_train_eval_predict(cora_run):
    folder, config = cora_run
    out = gnnssd("train", "--config", config).stdout
    assert "best valid accuracy" in out
    records = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert {"train_loss", "valid_acc", "test_acc", "stages_s", "epoch_s"} <= set(records[-1])
    scores = json.loads(gnnssd("eval", "--config", config, "--split", "test").stdout)
    assert 0 < scores["test"]["accuracy"] <= 1 and scores["test"]["nodes"] == 1000
    gnnssd("predict", "--config", config, "--out", folder / "pred.npy")
    predictions = np.load(folder / "pred.npy")
    assert predictions.shape == (2708,) and predictions.min() >= 0 and predictions.max() < 7
    # Training again into the same run directory needs --resume.
    again = gnnssd("train", "--config", config, check=False)
    assert again.returncode == 2 and "pass --resume" in again.stderr


def test_errors_are_reported_not_raised(tmp_path):
    missing = gnnssd("info", tmp_path / "nowhere", check=False)
    assert missing.returncode == 2 and "no such store directory" in missing.stderr
    (tmp_path / "c.yaml").write_text("store: s\nrun_dir: r\nmodel: {layrs: 3}\n")
    bad = gnnssd("train", "--config", tmp_path / "c.yaml", check=False)
    assert bad.returncode == 2 and "model.layrs: unknown key" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_killed_training_resumes(tmp_path):
    gnnssd("preprocess", "synthetic", "--preset", "tiny", "--out", tmp_path / "store")
    config = tmp_path / "c.yaml"
    config.write_text("store: store\nrun_dir: run\nmodel: {hidden: 32}\n"
                      "sampler: {fanouts: [5, 5], batch_size: 64}\n"
                      "train: {epochs: 20, progress: false, eval_every: 20}\n")
    proc = subprocess.Popen([sys.executable, "-m", "gnnssd", "train", "--config", config], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint.exists()
    gnnssd("train", "--config", config, "--resume")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(1, 21))
    assert not list((tmp_path / "run").glob("*.tmp"))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_refused_saying_why(tmp_path):
    """`device: cuda` where torch sees no GPU: exit 2 before anything is written, naming the
    key and the reason (here torch's build or its missing device)."""
    gnnssd("preprocess", "synthetic", "--preset", "tiny", "--out", tmp_path / "store")
    config = tmp_path / "c.yaml"
    config.write_text("store: store\nrun_dir: run\ndevice: cuda\nmodel: {hidden: 16}\n")
    run = gnnssd("train", "--config", config, check=False)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "device: 'cuda' requested, but" in run.stderr and "CUDA" in run.stderr
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
