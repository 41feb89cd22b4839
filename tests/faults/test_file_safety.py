"""Fault cases of issue 33 on the files gnnssd writes and reads whole: every output goes
through one owner (storage_format.atomic: fresh O_EXCL|O_NOFOLLOW temporary, fsync, rename;
no non-regular target replaced; nothing written inside a store) and every small input
through another (storage_format.small_files: regular file, no link followed, bounded).

Each test is named after the fault it covers; stores are tiny and made here.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gnnssd.cli.commands import main
from gnnssd.datasets import ArraySource
from gnnssd.storage_format import StoreError, write_store
from gnnssd.training.tasks import Trainer
from gnnssd.core.config import config_from_dict

from tests.conftest import REPO, random_graph_arrays


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("files") / "store", ArraySource(**random_graph_arrays(seed=5)))


def _data(store: Path, run_dir: Path, epochs: int = 1) -> dict:
    return {"store": str(store), "run_dir": str(run_dir), "seed": 1,
            "model": {"name": "sage", "hidden": 8, "layers": 2},
            "sampler": {"fanouts": [4, 4], "batch_size": 64},
            "train": {"epochs": epochs, "lr": 0.01, "progress": False}}


def _config(store: Path, run_dir: Path, epochs: int = 1) -> Path:
    path = run_dir.parent / f"{run_dir.name}-{epochs}.yaml"
    path.write_text(yaml.safe_dump(_data(store, run_dir, epochs)))
    return path


def _train(store: Path, run_dir: Path, epochs: int = 1, resume: bool = False) -> None:
    trainer = Trainer(config_from_dict(_data(store, run_dir, epochs)))
    try:
        trainer.fit(resume=resume)
    finally:
        trainer.close()


def _one_line_error(capsys, argv: list[str], *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gnnssd: error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, err)
    return lines[0]


def _special_targets(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a symlink to a victim file and (as root) a character device like /dev/null."""
    targets = {"fifo": tmp_path / "fifo", "symlink": tmp_path / "link"}
    os.mkfifo(targets["fifo"])
    (tmp_path / "victim").write_text("the user's own file\n")
    targets["symlink"].symlink_to(tmp_path / "victim")
    if os.geteuid() == 0:
        targets["device"] = tmp_path / "null"
        os.mknod(targets["device"], stat.S_IFCHR | 0o666, os.makedev(1, 3))  # as /dev/null
    return targets


# --- case 3: an --out that is not a regular file is refused, not replaced -------------------

@pytest.mark.parametrize("command", ["predict", "embed"])
def test_out_that_is_not_a_regular_file_is_refused_and_kept(store, tmp_path, capsys, command):
    config = _config(store, tmp_path / "run")
    (tmp_path / "run").mkdir()
    for kind, target in _special_targets(tmp_path).items():
        before = os.lstat(target)
        _one_line_error(capsys, [command, "--config", str(config), "--out", str(target)], str(target),
                        "symbolic link" if kind == "symlink" else "not a regular file")
        after = os.lstat(target)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), kind
    assert (tmp_path / "victim").read_text() == "the user's own file\n"


# --- cases 4 and 5: planted symlinks at the run's old temporary names ----------------------

def test_symlink_at_checkpoint_tmp_does_not_redirect_the_checkpoint(store, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (run_dir / "checkpoint.pt.tmp").symlink_to(victim)
    _train(store, run_dir)
    assert victim.read_text() == "keep me\n"
    assert (run_dir / "checkpoint.pt.tmp").is_symlink()  # left as it was, never written through


def test_symlink_at_metrics_tmp_does_not_redirect_the_metrics_on_resume(store, tmp_path):
    run_dir = tmp_path / "run"
    _train(store, run_dir, epochs=1)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (run_dir / "metrics.jsonl.tmp").symlink_to(victim)
    _train(store, run_dir, epochs=2, resume=True)
    assert victim.read_text() == "keep me\n"


def test_metrics_log_that_is_a_symlink_is_refused(store, tmp_path):
    from gnnssd.training.checkpoint import MetricsLog

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        MetricsLog(tmp_path).append({"epoch": 1})
    assert victim.read_text() == "keep me\n"


# --- case 6: outputs never land inside a store ---------------------------------------------

@pytest.mark.parametrize("command", ["predict", "embed"])
@pytest.mark.parametrize("name", ["labels.npy", "features.bin", "new.npy"])
def test_out_inside_a_store_is_refused(store, tmp_path, capsys, command, name):
    config = _config(store, tmp_path / "run")
    (tmp_path / "run").mkdir()
    files = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
    _one_line_error(capsys, [command, "--config", str(config), "--out", str(store / name)],
                    str(store / name), "inside the store")
    assert {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()} == files


def test_run_dir_that_is_a_store_gets_no_checkpoint(store, tmp_path):
    from gnnssd.storage_format import UnsafeOutputError, atomic_write_bytes

    with pytest.raises(UnsafeOutputError, match="inside the store"):
        atomic_write_bytes(store / "checkpoint.pt", b"x")
    assert not (store / "checkpoint.pt").exists()


# --- cases 9 and 10: calibration.json a FIFO, or a link to /dev/zero ------------------------

def _child(body: str, store: Path, memory_limit: int = 1 << 30) -> subprocess.CompletedProcess:
    """`body` in a child process bounded in time and in memory (a fault would hang, or fill
    memory: `memory_limit` bytes past what the imports mapped); it prints what it raises."""
    script = ("import os, resource, sys\nfrom pathlib import Path\n"
              "import gnnssd.pipeline, gnnssd.core.config, gnnssd.storage_format  # mapped before the bound\n"
              "mapped = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
              f"resource.setrlimit(resource.RLIMIT_AS, (mapped + {memory_limit}, mapped + {memory_limit}))\n"
              "store = Path(sys.argv[1])\ntry:\n" + "".join(f"    {line}\n" for line in body.splitlines())
              + "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    try:
        return subprocess.run([sys.executable, "-c", script, str(store)], cwd=REPO, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung reading the file")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_calibration_that_is_not_a_regular_file_is_refused(store, tmp_path, kind):
    copy = tmp_path / "store"
    copy.mkdir()
    for p in store.iterdir():
        (copy / p.name).symlink_to(p) if p.name != "manifest.json" else (copy / p.name).write_bytes(p.read_bytes())
    target = copy / "calibration.json"
    os.mkfifo(target) if kind == "fifo" else target.symlink_to("/dev/zero")
    done = _child("from gnnssd.pipeline import load_cost_model\nload_cost_model(store)", copy)
    assert done.stdout.startswith("StoreError"), done.stdout + done.stderr[-2000:]
    assert str(target) in done.stdout
    assert ("FIFO" if kind == "fifo" else "symbolic link") in done.stdout


def test_config_that_is_a_fifo_is_refused(tmp_path):
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    done = _child("from gnnssd.core.config import load_config\nload_config(store)", path)
    assert done.stdout.startswith("ConfigError") and "FIFO" in done.stdout, done.stdout + done.stderr[-2000:]


def test_manifest_that_links_to_dev_zero_is_refused(store, tmp_path):
    copy = tmp_path / "store"
    copy.mkdir()
    for p in store.iterdir():
        (copy / p.name).symlink_to(p if p.name != "manifest.json" else "/dev/zero")
    done = _child("from gnnssd.storage_format import Store\nStore.open(store)", copy)
    assert done.stdout.startswith("StoreError") and "symbolic link" in done.stdout, done.stdout + done.stderr[-2000:]


# --- case 14: preprocess over a store holding a user's own file -----------------------------

def test_preprocess_over_a_store_with_a_foreign_file_is_refused_and_keeps_it(tmp_path):
    source = ArraySource(**random_graph_arrays(seed=6))
    out = write_store(tmp_path / "store", source)
    (out / "my_notes.txt").write_text("mine\n")
    with pytest.raises(StoreError, match="my_notes.txt"):
        write_store(out, source)
    assert (out / "my_notes.txt").read_text() == "mine\n"


def test_preprocess_after_a_kill_between_mkdir_and_marker_resumes(tmp_path):
    source = ArraySource(**random_graph_arrays(seed=6))
    (tmp_path / ".store.partial").mkdir()  # what a kill right after the mkdir leaves
    write_store(tmp_path / "store", source)
    assert (tmp_path / "store" / "manifest.json").is_file()


# --- partial: a full disk names the file and its disk --------------------------------------

def test_output_on_a_full_disk_names_the_file_and_the_disk(tmp_path):
    script = ("import resource, signal, sys\nimport numpy as np\nfrom pathlib import Path\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
              "from gnnssd.storage_format import atomic_file\n"
              "try:\n    with atomic_file(Path(sys.argv[1])) as f:\n        np.save(f, np.zeros(100_000))\n"
              "except OSError as exc:\n    print(exc)\n")
    out = tmp_path / "predictions.npy"
    done = subprocess.run([sys.executable, "-c", script, str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.startswith(f"{out}: cannot write ("), done
    assert f"on the file system of {tmp_path} (" in done.stdout, done
    assert list(tmp_path.iterdir()) == []


# --- demo --out over a folder it did not make ------------------------------------------------

def test_demo_out_over_a_users_folder_is_refused_and_kept(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my own")
    assert main(["demo", "--out", str(folder)]) == 2
    assert "the demo did not make" in capsys.readouterr().err
    assert (folder / "notes.txt").read_text() == "my own"


def test_demo_rerun_removes_only_its_own_entries(tmp_path):
    from gnnssd.cli.demo import DEMO_ENTRIES, DEMO_MARKER, prepare_out

    out = tmp_path / "demo"
    prepare_out(out)  # a new folder, marked
    for name in DEMO_ENTRIES:
        (out / name).mkdir() if "." not in name else (out / name).write_text("old")
    (out / "store" / "x.npy").write_text("old")
    (out / "kept.txt").write_text("a file the user put there")
    prepare_out(out)  # a rerun over the demo's own folder
    assert sorted(p.name for p in out.iterdir()) == sorted([DEMO_MARKER, "kept.txt"])
    with pytest.raises(ValueError, match="not a folder"):
        prepare_out(out / "kept.txt")


def test_demo_folder_from_before_the_marker_is_replaced_but_a_look_alike_is_not(tmp_path, capsys):
    from gnnssd.cli.demo import DEMO_MARKER, _demo_config_text, prepare_out

    old = tmp_path / "old_demo"  # what `gnnssd demo` left before it marked its folder
    (old / "store").mkdir(parents=True)
    (old / "config.yaml").write_text(_demo_config_text())
    prepare_out(old)
    assert sorted(p.name for p in old.iterdir()) == [DEMO_MARKER]
    mine = tmp_path / "project"  # the same names, but a config of the user's own
    (mine / "store").mkdir(parents=True)
    (mine / "config.yaml").write_text("store: store\nrun_dir: run\n")
    assert main(["demo", "--out", str(mine)]) == 2
    assert "the demo did not make" in capsys.readouterr().err
    assert (mine / "store").is_dir() and (mine / "config.yaml").exists()
