"""Bad input: a clear error naming the problem, and no partial store left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gnnssd.datasets import ArraySource, HeterophilousSource, PlanetoidSource
from gnnssd.storage_format import DatasetError, Store, write_store

from tests.conftest import REPO, random_graph_arrays, shared_dataset


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _expect_error(tmp_path: Path, match: str, **changes) -> None:
    data = random_graph_arrays()
    data.update(changes)
    with pytest.raises(DatasetError, match=match):
        write_store(tmp_path / "out", ArraySource(**data))
    assert not (tmp_path / "out").exists()


def test_wrong_feature_shape(tmp_path):
    with pytest.raises(DatasetError, match="features must be a 2-D array"):
        ArraySource(**{**random_graph_arrays(), "features": np.zeros(300)})


def test_label_count_mismatch(tmp_path):
    with pytest.raises(DatasetError, match="299 labels for 300 feature rows"):
        ArraySource(**{**random_graph_arrays(), "labels": np.zeros(299, dtype=np.int64)})


def test_labels_out_of_range(tmp_path):
    labels = np.zeros(300, dtype=np.int64)
    labels[17] = -5
    _expect_error(tmp_path, "label -5 of node 17 is out of range", labels=labels)


def test_split_node_without_label(tmp_path):
    data = random_graph_arrays()
    labels = data["labels"].copy()
    labels[data["splits"]["train"][3]] = -1
    _expect_error(tmp_path, "split 'train' has no label", labels=labels)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_features(tmp_path, bad):
    feats = random_graph_arrays()["features"]
    feats[42, 3] = bad
    _expect_error(tmp_path, "at node 42, column 3 is not finite", features=feats)


def test_float16_overflow(tmp_path):
    data = random_graph_arrays()
    data["features"][5, 1] = 1e6
    with pytest.raises(DatasetError, match="node 5, column 1 does not fit float16"):
        write_store(tmp_path / "out", ArraySource(**data), dtype="float16")


def test_edge_endpoint_out_of_range(tmp_path):
    src, dst = random_graph_arrays()["edges"]
    dst = dst.copy()
    dst[9] = 300
    _expect_error(tmp_path, "edge 9 has destination 300, outside the node range 0..299", edges=(src, dst))


def test_overlapping_splits(tmp_path):
    splits = dict(random_graph_arrays()["splits"])
    splits["test"] = np.concatenate([splits["test"], splits["train"][:1]])
    _expect_error(tmp_path, "is in both split 'train' and split 'test'", splits=splits)


def test_split_out_of_range(tmp_path):
    splits = dict(random_graph_arrays()["splits"])
    splits["valid"] = np.array([1, 2, 1000])
    _expect_error(tmp_path, "split 'valid' holds node 1000, outside 0..299", splits=splits)


def test_missing_planetoid_file(tmp_path, planetoid_root):
    for f in planetoid_root.glob("ind.cora.*"):
        if not f.name.endswith(".ty"):
            os.symlink(f, tmp_path / f.name)
    with pytest.raises(DatasetError, match=r"ind\.cora\.ty: missing input file"):
        PlanetoidSource(tmp_path, "cora")


def test_unreadable_planetoid_file(tmp_path, planetoid_root):
    for f in planetoid_root.glob("ind.cora.*"):
        if f.name.endswith(".allx"):
            (tmp_path / f.name).write_bytes(b"\x80\x04 not a pickle")
        else:
            os.symlink(f, tmp_path / f.name)
    with pytest.raises(DatasetError, match=r"ind\.cora\.allx: not a readable Planetoid pickle"):
        PlanetoidSource(tmp_path, "cora")


def test_input_path_is_a_directory(tmp_path):
    (tmp_path / "graph.npz").mkdir()
    with pytest.raises(DatasetError, match="graph.npz: expected a file, found a directory"):
        HeterophilousSource(tmp_path / "graph.npz")


def test_corrupt_npz(tmp_path):
    (tmp_path / "graph.npz").write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(DatasetError, match="graph.npz: not a readable .npz file"):
        HeterophilousSource(tmp_path / "graph.npz")


def test_npz_missing_array(tmp_path):
    np.savez(tmp_path / "g.npz", node_features=np.zeros((3, 2)))
    with pytest.raises(DatasetError, match=r"g.npz: missing arrays \['node_labels'"):
        HeterophilousSource(tmp_path / "g.npz")


def test_npz_split_index_out_of_range():
    path = shared_dataset("heterophilous", "minesweeper.npz")
    with pytest.raises(DatasetError, match="split 10 requested, file has splits 0..9"):
        HeterophilousSource(path, split=10)


def test_failed_preprocess_keeps_previous_store(tmp_path):
    good = write_store(tmp_path / "out", ArraySource(**random_graph_arrays()))
    before = (good / "manifest.json").read_bytes()
    data = random_graph_arrays(seed=3)
    data["features"][250, 0] = np.nan  # fails late: after topology, during features
    with pytest.raises(DatasetError):
        write_store(good, ArraySource(**data))
    assert (good / "manifest.json").read_bytes() == before
    Store.open(good, verify=True)


def test_killed_preprocess_then_rerun_succeeds(tmp_path):
    """SIGKILL in the middle of the feature copy, then the same command again."""
    out = tmp_path / "store"
    cmd = [sys.executable, "-m", "gnnssd", "preprocess", "synthetic", "--nodes", "400000",
           "--feat-dim", "128", "--out", str(out), "--order", "degree"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = tmp_path / ".store.partial" / "progress.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.exists() and '"rows"' in progress.read_text():
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "a killed preprocess must not leave a store under the final name"
    # the lock file of the killed run stays (unlocked: the kernel dropped its flock)
    assert _leftovers(tmp_path) == [".store.lock", ".store.partial"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    store = Store.open(out, verify=True)
    assert store.num_nodes == 400_000
    assert _leftovers(tmp_path) == ["store"]
