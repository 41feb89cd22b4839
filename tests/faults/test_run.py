"""Fault cases of the run side (issue 10): checkpoints, seeds, the run directory's lock and
scratch, stores with empty splits, non-finite losses, interrupts, config errors, resume.

Each test is named after the fault it covers; stores are tiny and made here. The modules
added by the fix are imported inside the tests that use them.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gnnssd.cli.commands import main
from gnnssd.core.config import ConfigError, config_from_dict
from gnnssd.datasets import ArraySource
from gnnssd.storage_format import write_store
from gnnssd.training.tasks import Trainer

from tests.conftest import REPO, random_graph_arrays

EMPTY = np.empty(0, dtype=np.int64)


def _store(path: Path, seed: int = 0, splits: dict | None = None, **sizes) -> Path:
    data = random_graph_arrays(seed=seed, **sizes)
    return write_store(path, ArraySource(data["features"], data["edges"], data["labels"],
                                         splits or data["splits"]))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return _store(tmp_path_factory.mktemp("faults") / "store")


def _data(store: Path, run_dir: Path, **sections) -> dict:
    data = {"store": str(store), "run_dir": str(run_dir), "seed": 1,
            "model": {"name": "sage", "hidden": 16, "layers": 2},
            "sampler": {"fanouts": [4, 4], "batch_size": 64},
            "train": {"epochs": 1, "lr": 0.01, "progress": False},
            "ssd": {"memory_budget": "64MiB"}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


def _config_file(store: Path, run_dir: Path, path: Path | None = None, **sections) -> Path:
    path = path or run_dir.parent / f"{run_dir.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(_data(store, run_dir, **sections)))
    return path


def _train(store: Path, run_dir: Path, resume: bool = False, **sections) -> list[dict]:
    trainer = Trainer(config_from_dict(_data(store, run_dir, **sections)))
    try:
        return trainer.fit(resume=resume)
    finally:
        trainer.close()


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def _assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gnnssd: error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, err)


# --- 1. a checkpoint must not run code --------------------------------------------------------

class _Hostile:
    """Unpickling this calls os.system, which creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


@pytest.mark.parametrize("command", [["train"], ["train", "--resume"], ["eval"],
                                     ["predict", "--out", "p.npy"]])
def test_hostile_checkpoint_runs_no_code(store, tmp_path, capsys, command):
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    run_dir.mkdir()
    torch.save({"epoch": 1, "model": _Hostile(marker)}, run_dir / "checkpoint.pt")
    config = _config_file(store, run_dir)
    command = [c if c != "p.npy" else str(tmp_path / c) for c in command]
    code, err = _cli(capsys, command[0], "--config", str(config), *command[1:])
    assert not marker.exists()
    _assert_one_line_error(code, err, str(run_dir / "checkpoint.pt"), "pickle-based", "refused")


def test_checkpoint_is_a_state_file_not_a_pickle(store, tmp_path):
    """Written as raw tensors and JSON: nothing in it is unpickled when it is read."""
    from gnnssd.training.state_file import MAGIC, decode_state

    run_dir = tmp_path / "run"
    _train(store, run_dir)
    data = (run_dir / "checkpoint.pt").read_bytes()
    assert data.startswith(MAGIC)
    assert decode_state(data)["epoch"] == 1


def test_flipped_checkpoint_byte_is_detected(store, tmp_path, capsys):
    run_dir = tmp_path / "run"
    _train(store, run_dir)
    path = run_dir / "checkpoint.pt"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10  # the middle of the file: the payload's tensor bytes
    path.write_bytes(raw)
    code, err = _cli(capsys, "eval", "--config", str(_config_file(store, run_dir)))
    _assert_one_line_error(code, err, str(path), "corrupt")


# --- 4. any seed ---------------------------------------------------------------------------

@pytest.mark.parametrize("features", ["memory", "ssd"])
@pytest.mark.parametrize("seed", [0, 2148, 12345, 2**40, -1])
def test_seed_out_of_dgl_int32_range_trains(store, tmp_path, features, seed):
    history = _train(store, tmp_path / "run", features=features, seed=seed)
    assert len(history) == 1 and np.isfinite(history[0]["train_loss"])


def test_seeds_map_into_range_and_stay_distinct():
    from gnnssd.core.runtime import SEED_RANGE, epoch_seed, run_seed

    seeds = [0, 2148, 12345, 2**40, -1, -(2**70)]
    mapped = [run_seed(s) for s in seeds]
    assert all(0 <= m < SEED_RANGE for m in mapped) and len(set(mapped)) == len(seeds)
    assert all(0 <= epoch_seed(s, e) < SEED_RANGE for s in seeds for e in (1, 10**6))


# --- 5. one writer per run directory; scratch of its own -----------------------------------

def test_second_writer_is_refused_naming_the_holder(store, tmp_path):
    from gnnssd.training.rundir import RunDirBusy, RunLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = RunLock(run_dir, exclusive=True)
    try:
        with pytest.raises(RunDirBusy, match=f"{run_dir}: in use by training process pid {os.getpid()}"):
            _train(store, run_dir)
        trainer = Trainer(config_from_dict(_data(store, run_dir)))
        with pytest.raises(RunDirBusy, match="training process"):
            trainer.load_best()  # eval/predict while training
        trainer.close()
    finally:
        holder.release()
    assert not (run_dir / "metrics.jsonl").exists()
    _train(store, run_dir)  # released: training goes ahead


def test_writer_is_refused_while_a_reader_holds_the_run(store, tmp_path):
    run_dir = tmp_path / "run"
    _train(store, run_dir)
    reader = Trainer(config_from_dict(_data(store, run_dir)))
    reader.load_best()
    second_reader = Trainer(config_from_dict(_data(store, run_dir)))
    second_reader.load_best()  # readers share
    try:
        with pytest.raises(RuntimeError, match="in use by eval/predict"):
            _train(store, run_dir, resume=True, train={"epochs": 2})
    finally:
        reader.close()
        second_reader.close()
    assert _train(store, run_dir, resume=True, train={"epochs": 2})[0]["epoch"] == 2


def test_user_blocks_folder_survives_ssd_training(store, tmp_path):
    run_dir = tmp_path / "run"
    user = run_dir / "blocks" / "notes.txt"
    user.parent.mkdir(parents=True)
    user.write_text("mine")
    stale = run_dir / ".gnnssd-scratch" / "999999-dead" / "plan_e1_m0.npz"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    history = _train(store, run_dir, features="ssd", ssd={"block_budget": "1MiB", "mega_batch": 2},
                     train={"epochs": 2})
    assert len(history) == 2
    assert user.read_text() == "mine"
    assert not (run_dir / ".gnnssd-scratch").exists()  # the stale scratch and its own


FORGOTTEN_CLOSE = """
import gc, glob, os, sys, tempfile
import numpy as np
from gnnssd import EdgeLoader, FeatureSource, NodeLoader
from gnnssd.storage_format import Store
store, kind, end = Store.open(sys.argv[1]), sys.argv[2], sys.argv[3]
ids = np.asarray(store.train_idx)
if kind == "NodeLoader":
    kept = NodeLoader(store, ids, fanouts=[3, 3], batch_size=32, features="ssd", memory_budget="32MiB")
    next(iter(kept))
elif kind == "EdgeLoader":
    kept = EdgeLoader(store, np.stack([ids[:40], ids[40:80]], 1), fanouts=[3, 3], batch_size=16,
                      features="ssd", memory_budget="32MiB")
    next(iter(kept))
else:
    kept = FeatureSource(store, "ssd")
print("scratch", len(glob.glob(os.path.join(tempfile.gettempdir(), "gnnssd-scratch-*"))), flush=True)
if end == "collected":
    del kept
    gc.collect()
    print("after collection", len(glob.glob(os.path.join(tempfile.gettempdir(), "gnnssd-scratch-*"))))
"""


@pytest.mark.parametrize("end", ["exit", "collected"])
@pytest.mark.parametrize("kind", ["NodeLoader", "EdgeLoader", "FeatureSource"])
def test_forgotten_close_leaves_no_scratch_in_the_temp_dir(store, tmp_path, kind, end):
    """An ssd-mode loader or source never closed: its private scratch directory goes when it
    is garbage collected, or at the latest when the interpreter exits."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    run = subprocess.run([sys.executable, "-c", FORGOTTEN_CLOSE, str(store), kind, end], cwd=REPO,
                         env={**os.environ, "TMPDIR": str(temp)}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "scratch 1" in run.stdout, run.stdout  # it had one while open
    if end == "collected":
        assert "after collection 0" in run.stdout, run.stdout
    assert list(temp.glob("gnnssd-scratch-*")) == []
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_iterating_a_closed_loader_is_refused(store, features):
    from gnnssd import EdgeLoader, FeatureSource, NodeLoader
    from gnnssd.storage_format import Store

    opened = Store.open(store)
    ids = np.asarray(opened.train_idx)
    options = {"fanouts": [3, 3], "features": features, "memory_budget": "32MiB"}
    loaders = [NodeLoader(opened, ids, batch_size=32, **options),
               EdgeLoader(opened, np.stack([ids[:40], ids[40:80]], 1), batch_size=16, **options)]
    for loader in loaders:
        next(iter(loader))
        loader.close()
        with pytest.raises(RuntimeError, match=rf"this {type(loader).__name__} is closed"):
            next(iter(loader))
    source = FeatureSource(opened, features)
    view = NodeLoader(source, ids, fanouts=[3, 3], batch_size=32)
    next(iter(view))
    source.close()
    with pytest.raises(RuntimeError, match=rf"this FeatureSource \({features} features of .*\) is closed"):
        next(iter(view))
    with pytest.raises(RuntimeError, match=r"FeatureSource .* is closed"):
        NodeLoader(source, ids, fanouts=[3, 3], batch_size=32)


# --- 8. stores training must still handle ---------------------------------------------------

@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_empty_test_split_trains_and_metrics_say_so(tmp_path, features):
    data = random_graph_arrays()
    store = _store(tmp_path / "store", splits={**data["splits"], "test": EMPTY})
    history = _train(store, tmp_path / "run", features=features, train={"epochs": 2})
    assert [r["skipped_splits"] for r in history] == [["test"], ["test"]]
    assert all("valid_acc" in r and "test_acc" not in r for r in history)


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_one_node_graph_trains(tmp_path, capsys, features):
    one = ArraySource(np.ones((1, 4), np.float32), (np.array([0]), np.array([0])), np.array([1]),
                      {"train": np.array([0]), "valid": EMPTY, "test": EMPTY})
    store = write_store(tmp_path / "store", one)
    config = _config_file(store, tmp_path / "run", features=features, train={"epochs": 2})
    code, err = _cli(capsys, "train", "--config", str(config))
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_splits"] for r in records] == [["valid", "test"]] * 2
    assert records[-1]["best_epoch"] == 2  # no validation: the latest model is kept
    code, err = _cli(capsys, "predict", "--config", str(config), "--out", str(tmp_path / "p.npy"))
    assert code == 0, err
    assert np.load(tmp_path / "p.npy").shape == (1,)


# --- 3. non-finite loss ----------------------------------------------------------------------

def test_non_finite_loss_stops_naming_epoch_and_batch(store, tmp_path, capsys):
    run_dir = tmp_path / "run"
    from gnnssd.training.checkpoint import load_checkpoint

    # One mini-batch per epoch: epoch 1's loss is finite, its step (lr 1e37) makes the
    # weights ~1e37, and epoch 2's logits overflow.
    config = _config_file(store, run_dir, sampler={"batch_size": 128}, train={"epochs": 4, "lr": 1e37})
    code, err = _cli(capsys, "train", "--config", str(config))
    _assert_one_line_error(code, err, "epoch 2, mini-batch 1/1: the loss is", "checkpoint of epoch 1 is kept",
                           f"gnnssd verify {store}")
    assert load_checkpoint(run_dir)["epoch"] == 1  # the last good epoch, intact


# --- partly held: interrupts ------------------------------------------------------------------

@pytest.mark.parametrize("presses", [1, 4])
def test_ctrl_c_during_ssd_training_exits_130_once(store, tmp_path, presses):
    from gnnssd.training.checkpoint import load_checkpoint

    run_dir = tmp_path / "run"
    config = _config_file(store, run_dir, features="ssd", sampler={"batch_size": 16},
                          ssd={"block_budget": "1MiB", "mega_batch": 2}, train={"epochs": 100_000})
    proc = subprocess.Popen([sys.executable, "-m", "gnnssd", "train", "--config", str(config)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 900  # a bound against a hang, not a speed check: CI runners are busy
        while not (run_dir / "checkpoint.pt").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "training never finished an epoch"
            time.sleep(0.05)
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the test failed: do not leave a 100,000-epoch run behind
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.count("interrupted") == 1, err
    assert not (run_dir / ".gnnssd-scratch").exists() and not (run_dir / "blocks").exists()
    assert load_checkpoint(run_dir)["epoch"] >= 1  # the last whole epoch's checkpoint is intact


def test_ctrl_c_inside_a_model_step_is_raised_when_the_step_ends():
    """A Ctrl-C inside DGL's Python backward used to leave autograd nodes for exit to free,
    and the process hung at exit waiting for the GIL; the step now finishes first."""
    from gnnssd.core.runtime import one_interrupt, uninterruptible

    finished = []
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt), one_interrupt():
            with uninterruptible():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here, and must not raise
                finished.append("step")
            finished.append("after the step")  # not reached: the interrupt is raised first
    finally:  # once interrupted, one_interrupt leaves Ctrl-C ignored: not for the tests after this one
        signal.signal(signal.SIGINT, previous)
    assert finished == ["step"]


# --- partly held: config errors, one line naming the key --------------------------------------

@pytest.mark.parametrize("key", ["lr", "weight_decay"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_lr_or_weight_decay_is_refused(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"train.{key}"):
        config_from_dict(_data(tmp_path / "store", tmp_path / "run", train={key: value}))


def test_model_too_big_for_memory_is_refused(store, tmp_path):
    with pytest.raises(ConfigError, match=r"model.hidden: 100000000 gives .* parameters, .*; "
                                          r"available memory is .*iB"):
        Trainer(config_from_dict(_data(store, tmp_path / "run", model={"hidden": 100_000_000})))


@pytest.mark.parametrize("heads, hidden", [(100_000_000, 16), (10**15, 16), (17, 16),
                                           (1_000_000, 1_000_000)])
def test_bad_gat_heads_are_blamed_on_model_heads(store, tmp_path, heads, hidden):
    """GAT splits model.hidden across its heads and its output layer has `heads` heads: a
    huge heads value is a model.heads error, not a model.hidden one."""
    with pytest.raises(ConfigError, match=rf"model\.heads: {heads} "):
        Trainer(config_from_dict(_data(store, tmp_path / "run",
                                       model={"name": "gat", "heads": heads, "hidden": hidden})))


def test_memory_budget_above_available_memory_is_refused(store, tmp_path):
    with pytest.raises(ConfigError, match=r"ssd.memory_budget: 100 TiB is more than the "
                                          r"available memory \(.*iB\)"):
        Trainer(config_from_dict(_data(store, tmp_path / "run", features="ssd",
                                       ssd={"memory_budget": "100TiB"})))


@pytest.mark.parametrize("override, key", [("train.epochs.x=1", "train.epochs.x"),
                                           ("seed=[", "seed"),
                                           ("seed=!!python/object/apply:os.system ['touch MARKER']", "seed"),
                                           ("seed=!!binary aGk=", "seed")])
def test_bad_set_override_is_one_line_naming_the_key(store, tmp_path, capsys, monkeypatch, override, key):
    monkeypatch.chdir(tmp_path)
    config = _config_file(store, tmp_path / "run")
    code, err = _cli(capsys, "train", "--config", str(config), "--set", override)
    _assert_one_line_error(code, err, f"{key}:")
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("make", ["file", "under_a_file"])
def test_unusable_run_dir_is_one_line_naming_the_key(store, tmp_path, capsys, make):
    (tmp_path / "taken").write_text("a file")
    run_dir = tmp_path / "taken" if make == "file" else tmp_path / "taken" / "run"
    config = _config_file(store, run_dir, path=tmp_path / "config.yaml")
    code, err = _cli(capsys, "train", "--config", str(config))
    _assert_one_line_error(code, err, "run_dir:", str(run_dir))
    assert (tmp_path / "taken").read_text() == "a file"


# --- partly held: metrics log, store identity, the user's config.yaml -------------------------

def test_torn_last_metrics_line_is_dropped_on_resume(store, tmp_path):
    run_dir = tmp_path / "run"
    _train(store, run_dir)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "train_lo')  # the write the interruption cut short
    history = _train(store, run_dir, resume=True, train={"epochs": 2})
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [r["epoch"] for r in history] == [2] and [json.loads(x)["epoch"] for x in lines] == [1, 2]


def test_bad_metrics_line_before_the_last_is_named(store, tmp_path):
    from gnnssd.training.checkpoint import CheckpointError

    run_dir = tmp_path / "run"
    _train(store, run_dir, train={"epochs": 2})
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("not json\n" + lines[1] + "\n")
    with pytest.raises(CheckpointError, match=f"{path}: line 1 is not a metrics record"):
        _train(store, run_dir, resume=True, train={"epochs": 3})


def test_resume_on_a_store_preprocessed_again_is_refused(tmp_path):
    store, run_dir = tmp_path / "store", tmp_path / "run"
    _store(store, seed=0)
    _train(store, run_dir)
    _store(store, seed=1)  # another dataset of the same shape into the same path
    with pytest.raises(ConfigError, match="is not the store the checkpoint .* was trained on"):
        _train(store, run_dir, resume=True, train={"epochs": 2})


@pytest.mark.parametrize("command", [["predict"], ["predict", "--layerwise"], ["embed"]])
def test_inference_against_another_store_of_the_same_dim_is_refused(store, tmp_path, capsys, command):
    """eval/predict compare the checkpoint's store fingerprint; layer-wise predict and embed
    must too (the other store has the same feature dim and classes: the weights would load)."""
    run_dir, other = tmp_path / "run", _store(tmp_path / "other", seed=1)
    _train(store, run_dir)
    config = _config_file(other, run_dir)
    code, err = _cli(capsys, *command, "--config", str(config), "--out", str(tmp_path / "out.npy"))
    _assert_one_line_error(code, err, f"store: {other} is not the store the checkpoint in {run_dir} "
                                      "was trained on")
    assert not (tmp_path / "out.npy").exists()


def test_users_config_yaml_in_run_dir_is_not_overwritten(store, tmp_path, capsys):
    run_dir = tmp_path / "run"
    config = run_dir / "config.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump(_data(store, Path("."))) + "# my notes\n")
    before = config.read_text()
    code, err = _cli(capsys, "train", "--config", str(config))
    assert code == 0, err
    assert config.read_text() == before
    assert yaml.safe_load((run_dir / "run_config.yaml").read_text())["seed"] == 1


# --- data parallel: ranks started with different configs -----------------------------------

def test_ranks_with_different_batch_size_or_lr_are_refused_naming_them(store, tmp_path):
    """Two torchrun-style ranks whose configs differ in sampler.batch_size (the ranks would
    run different numbers of collectives) and train.lr (diverging replicas): both stop
    before training naming the ranks and keys that differ. Their own paths may differ."""
    from tests.training.test_distributed import train_as_ranks

    configs = [_config_file(store, tmp_path / f"rank{rank}" / "run", sampler={"batch_size": batch_size},
                            train={"lr": lr}) for rank, (batch_size, lr) in enumerate([(64, 0.01), (32, 0.1)])]
    for returncode, stderr in train_as_ranks(configs, GNNSSD_DIST_TIMEOUT="10"):
        assert returncode == 2, stderr[-3000:]
        assert "the ranks' training configs differ: rank 1 has sampler.batch_size 32 (rank 0: 64), " \
               "train.lr 0.1 (rank 0: 0.01)" in stderr, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
    assert not list(tmp_path.glob("rank*/run/metrics.jsonl"))


# --- also found: I/O counters from several threads -------------------------------------------

def test_io_counters_lose_no_counts_across_threads():
    from gnnssd.loading.types import IOCounters

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        counters, n, threads = IOCounters(), 20_000, 4
        workers = [threading.Thread(target=lambda: [counters.add(bytes_read=1, requests=2)
                                                    for _ in range(n)]) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    assert counters.as_dict() == {"bytes_read": n * threads, "bytes_written": 0, "requests": 2 * n * threads,
                                  "useful_bytes": 0}


# --- a checkpoint written to a full disk -----------------------------------------------------

def _under_file_size_limit(limit: int, folder: Path, error: str, body: str) -> subprocess.CompletedProcess:
    """`body` run in a child whose files may not grow past `limit` bytes (writes past it
    fail with EFBIG, as on a full disk), `folder` its Path; the child prints the `error`
    it catches and exits 3 (any other end is the caller's failure)."""
    script = ("import resource, signal, sys\nfrom pathlib import Path\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
              "folder = Path(sys.argv[1])\ntry:\n" + "".join(f"    {line}\n" for line in body.splitlines())
              + f"except {error} as exc:\n    print(exc)\n    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", script, str(folder)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    return done


def test_checkpoint_on_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path):
    """The file-size limit (EFBIG, as ENOSPC on a full disk) hits the checkpoint's write: a
    CheckpointError naming the file, no checkpoint.pt.tmp left, the previous checkpoint
    still loads."""
    from gnnssd.training.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, {"epoch": 1, "w": torch.ones(10)})
    done = _under_file_size_limit(4096, tmp_path, "CheckpointError", (
        "import torch\n"
        "from gnnssd.training.checkpoint import CheckpointError, save_checkpoint\n"
        "save_checkpoint(folder, {'epoch': 2, 'w': torch.zeros(100_000)})\n"))
    assert f"{tmp_path / 'checkpoint.pt'}: cannot write the checkpoint (File too large" in done.stdout
    assert "the previous checkpoint is unchanged" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    state = load_checkpoint(tmp_path)
    assert state["epoch"] == 1 and torch.equal(state["w"], torch.ones(10))


@pytest.mark.parametrize("allocated", [False, True])
def test_scratch_disk_full_while_writing_compact_blocks_names_the_file_and_the_way_out(tmp_path, allocated):
    """The compact-block writer meets a full scratch disk (the file-size limit's EFBIG here)
    as it writes, or, allocating each file at its final size (as repack does), when it opens
    them: an OSError naming the block file and ssd.block_budget: 0, not a bare errno."""
    rows = "rows=[512]" if allocated else "rows=None"
    done = _under_file_size_limit(8192, tmp_path, "OSError", (
        "import numpy as np\n"
        "from gnnssd.io_engine.engine import alloc\n"
        "from gnnssd.pipeline.block_writer import BlockWriter\n"
        "staging = alloc(1 << 16)\n"
        f"with BlockWriter([folder / 'block-0.bin'], 512, alloc, max_chunk=4096, {rows}) as writer:\n"
        "    for _ in range(8):\n"
        "        writer.append(0, staging, np.arange(64) * 512)\n"))
    assert f"{tmp_path / 'block-0.bin'}: cannot write (File too large)" in done.stdout
    assert "set ssd.block_budget: 0" in done.stdout


@pytest.mark.parametrize("kept", ["rows.bin", "scan.bin"])
def test_scratch_disk_full_while_a_packer_keeps_a_windows_rows_names_the_file_and_the_disk(tmp_path, kept):
    """A packer's window keeps its plans' rows and its scan's in files of its folder
    (packers.RowsFile, rows_mapped: the latter's space allocated before it is mapped, so no
    SIGBUS): a full scratch disk (the file-size limit's EFBIG here) is an OutputWriteError
    naming that file and its file system, not a bare errno (the pool raises it in the
    trainer, naming the packer and window: test_packers)."""
    done = _under_file_size_limit(8192, tmp_path, "OSError", (
        "import numpy as np\n"
        "from gnnssd.pipeline.packers import RowsFile, rows_mapped\n"
        + ("rows_mapped(folder / 'scan.bin', 4000)\n" if kept == "scan.bin" else "")
        + "with RowsFile(folder / 'rows.bin') as rows:\n"
        "    for _ in range(4):\n"
        "        rows.add(np.arange(1000))\n"
        "    rows.mapped()\n"))
    assert f"{tmp_path / kept}: cannot write (File too large) on the file system of" in done.stdout
    assert "bytes free" in done.stdout


def test_a_checkpoint_from_before_a_new_config_key_resumes(store, tmp_path):
    """model.featureless came after this checkpoint was written: its config has no such key,
    which counts as the key's default (not as a different model)."""
    from gnnssd.training.checkpoint import load_checkpoint, save_checkpoint

    run_dir = tmp_path / "run"
    _train(store, run_dir, train={"epochs": 1})
    state = load_checkpoint(run_dir)
    config = json.loads(state["config"])
    del config["model"]["featureless"]
    save_checkpoint(run_dir, {**state, "config": json.dumps(config)})
    history = _train(store, run_dir, resume=True, train={"epochs": 2})
    assert [r["epoch"] for r in history] == [2]
