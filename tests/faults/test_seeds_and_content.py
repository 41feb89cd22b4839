"""Fault cases of issue 33 on values that make results wrong: a seed order's output gets
the checks seeds passed in get (sampler.seed_order.checked_order, where every seed passes),
a store's content that would silently mislabel rows is refused at open, a checkpoint's
epoch and tensors are checked against the run, and a zero memory budget is a config error.

Each test is named after the fault it covers; stores are tiny and made here.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from gnnssd import NodeLoader
from gnnssd.core.config import ConfigError, config_from_dict
from gnnssd.datasets import ArraySource
from gnnssd.sampler import SeedOrder
from gnnssd.storage_format import DatasetError, Store, StoreError, write_store
from tests.faults.test_hostile_inputs import _tamper
from tests.faults.test_run import _train

from tests.conftest import random_graph_arrays


class _Fixed(SeedOrder):
    """A user's policy that puts `value` first."""

    name = "fixed"

    def __init__(self, value):
        self.value = value

    def _order(self, seeds, seed, epoch):
        return [self.value, *seeds[1:].tolist()]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("content") / "store", ArraySource(**random_graph_arrays(seed=7)))


# --- cases 7 and 12: a custom SeedOrder's output ---------------------------------------------

@pytest.mark.parametrize("value, message", [(10**12, "node 1000000000000, outside the seeds"),
                                            (-3, "node -3, outside the seeds"),
                                            (1.7, r"float64 of shape \(\d+,\) \(e\.g\. 1\.7\)")])
def test_seed_order_output_outside_the_seeds_or_not_integer_is_refused(value, message):
    with pytest.raises(ValueError, match=rf"seed_order _Fixed: returned {message}"):
        _Fixed(value).order(np.arange(10, 20), 0, 1)


@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_float_seed_from_a_policy_is_refused_by_the_loader(store, tmp_path, features):
    seeds = Store.open(store).train_idx
    loader = NodeLoader(store, seeds, fanouts=[2, 2], batch_size=16, shuffle=True, seed_order=_Fixed(1.7),
                        features=features, scratch_dir=tmp_path)
    try:
        with pytest.raises(ValueError, match=r"seed_order _Fixed: returned float64 .*1\.7"):
            next(iter(loader))
    finally:
        loader.close()


# --- case 11: perm not a permutation is refused at open ------------------------------------

def test_perm_that_is_not_a_permutation_is_refused_at_open(store, tmp_path):
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    perm = np.load(copy / "perm.npy")
    perm[0] = perm[1]
    _tamper(copy, "perm.npy", perm)
    with pytest.raises(StoreError, match=r"perm\.npy: .*expected perm and inv to be inverse permutations"):
        Store.open(copy)


# --- case 13: a typed store whose target is a featureless, unlabelled type -----------------

def test_typed_store_whose_target_is_unlabelled_is_refused_at_open(tmp_path):
    from gnnssd.storage_format.manifest import MANIFEST, manifest_checksum
    from tests.hetero_graph import ToyHeteroSource

    out = write_store(tmp_path / "typed", ToyHeteroSource())
    manifest = json.loads((out / MANIFEST).read_text())
    unlabelled = next(t["name"] for t in manifest["schema"]["node_types"] if not t["features"])
    manifest["schema"]["target"] = unlabelled
    manifest["checksum"] = manifest_checksum(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=rf"schema target '{unlabelled}'"):
        Store.open(out)


def test_typed_store_whose_target_has_no_labelled_node_is_refused_at_open(tmp_path):
    """The splits moved into the unlabelled type with the target: the splits agree with the
    target, and only the labels show that it names the wrong type."""
    from gnnssd.storage_format.manifest import MANIFEST, manifest_checksum
    from tests.hetero_graph import ToyHeteroSource

    out = write_store(tmp_path / "typed", ToyHeteroSource())
    schema = Store.open(out).schema
    unlabelled = next(t.name for t in schema.node_types if not t.features)
    t = schema.type_id(unlabelled)
    lo = int(schema.offsets[t])
    for k, name in enumerate(("train_idx", "valid_idx", "test_idx")):
        _tamper(out, f"{name}.npy", lo + np.arange(3 * k, 3 * k + 3, dtype=np.int64))
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["schema"]["target"] = unlabelled
    manifest["checksum"] = manifest_checksum(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=rf"manifest\.json: .*schema target '{unlabelled}' has no labelled node"):
        Store.open(out)


# --- a tampered typed store: an edge relabelled with another relation ----------------------

@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_typed_store_with_an_edge_of_another_relation_is_refused_before_sampling(tmp_path, features):
    """Refused at open, naming etypes.npy (before: the memory loader failed deep in DGL and
    the ssd loader sampled another type's rows without a word)."""
    from tests.hetero_graph import ToyHeteroSource

    out = write_store(tmp_path / "typed", ToyHeteroSource())
    etypes = np.load(out / "etypes.npy")
    edge = int(np.flatnonzero(etypes == 0)[-1])
    etypes[edge] = 1  # a paper -> paper edge labelled author -> paper, still in relation order
    _tamper(out, "etypes.npy", etypes)
    with pytest.raises(StoreError, match=rf"etypes\.npy: edge {edge} \(relation author-writes-paper\)"):
        NodeLoader(out, np.arange(10), fanouts=[{"cites": 2, "writes": 2, "written_by": 2,
                                                 "affiliated_with": 2, "employs": 2}] * 2,
                   batch_size=4, features=features, scratch_dir=tmp_path)


# --- case 2: a Planetoid CSR matrix whose indices lie past its shape -----------------------

def _planetoid_layout(root: Path, n_all: int = 40, n_test: int = 10, dim: int = 6, classes: int = 3) -> None:
    """A tiny Planetoid dataset in the original files' form (CSR features, one-hot labels,
    a dict of adjacency lists, test.index)."""
    rng = np.random.default_rng(0)
    root.mkdir()
    onehot = np.eye(classes)[rng.integers(0, classes, n_all + n_test)]
    allx = sp.csr_matrix(rng.random((n_all, dim)) > 0.5, dtype=np.float32)
    parts = {"allx": allx, "ally": onehot[:n_all], "x": allx[:10], "y": onehot[:10],
             "tx": sp.csr_matrix(rng.random((n_test, dim)) > 0.5, dtype=np.float32), "ty": onehot[n_all:],
             "graph": {v: [int((v + 1) % (n_all + n_test))] for v in range(n_all + n_test)}}
    for name, value in parts.items():
        (root / f"ind.toy.{name}").write_bytes(pickle.dumps(value, protocol=4))
    np.savetxt(root / "ind.toy.test.index", rng.permutation(np.arange(n_all, n_all + n_test)), fmt="%d")


def test_planetoid_csr_with_out_of_range_indices_is_refused(tmp_path):
    from gnnssd.datasets import PlanetoidSource

    root = tmp_path / "planetoid"
    _planetoid_layout(root)
    assert PlanetoidSource(root, "toy").num_nodes == 50  # the layout reads as written
    tx = pickle.loads((root / "ind.toy.tx").read_bytes())
    tx.indices[0] = 2**30  # SciPy's toarray trusted this and crashed
    (root / "ind.toy.tx").write_bytes(pickle.dumps(tx, protocol=4))
    with pytest.raises(DatasetError, match=r"ind\.toy\.tx: a malformed sparse matrix"):
        PlanetoidSource(root, "toy")


# --- partial: checkpoint epoch and tensors; memory_budget 0 --------------------------------

def _rewrite_checkpoint(run_dir: Path, edit) -> None:
    from gnnssd.training.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(run_dir)
    edit(state)
    save_checkpoint(run_dir, state)


@pytest.mark.parametrize("epoch", [10**18, -5])
def test_checkpoint_with_an_impossible_epoch_is_refused_naming_the_key(store, tmp_path, epoch):
    from gnnssd.training.checkpoint import CheckpointError

    run_dir = tmp_path / "run"
    _train(store, run_dir)
    _rewrite_checkpoint(run_dir, lambda s: s.update(epoch=epoch))
    with pytest.raises(CheckpointError, match=rf"checkpoint\.pt: key 'epoch' is {epoch}"):
        _train(store, run_dir, resume=True, train={"epochs": 2})


@pytest.mark.parametrize("key", ["optimizer", "best"])
def test_checkpoint_whose_tensors_fit_no_model_is_refused_naming_the_key(store, tmp_path, key):
    from gnnssd.training.checkpoint import CheckpointError

    def damage(state):
        if key == "optimizer":
            first = next(iter(state["optimizer"]["state"].values()))
            first["exp_avg"] = torch.zeros(3, 3, 3)
        else:
            state["best"]["state"] = {name: torch.zeros(1) for name in state["best"]["state"]}

    run_dir = tmp_path / "run"
    _train(store, run_dir)
    _rewrite_checkpoint(run_dir, damage)
    with pytest.raises(CheckpointError, match=rf"checkpoint\.pt: key '{key}' does not fit"):
        _train(store, run_dir, resume=True, train={"epochs": 2})


def test_memory_budget_of_zero_is_a_config_error():
    with pytest.raises(ConfigError, match=r"ssd\.memory_budget.*above 0"):
        config_from_dict({"store": "s", "run_dir": "r", "ssd": {"memory_budget": 0}})


def test_npy_header_that_lies_about_its_shape_is_refused_naming_the_file(store, tmp_path):
    from gnnssd.storage_format.atomic import crc32_of_file
    from gnnssd.storage_format.manifest import MANIFEST, manifest_checksum

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    file = copy / "labels.npy"
    raw = bytearray(file.read_bytes())
    n = len(np.load(file))
    header = raw[:128].decode("latin1")
    raw[:128] = header.replace(f"({n},)", f"({n * 10},)".ljust(len(f"({n},)"))).encode("latin1")[:128]
    file.write_bytes(raw)
    manifest = json.loads((copy / MANIFEST).read_text())  # every checksum vouches for the lie
    manifest["files"]["labels.npy"].update(size=file.stat().st_size, crc32=crc32_of_file(file))
    manifest["checksum"] = manifest_checksum(manifest)
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"labels\.npy: not a readable \.npy array"):
        Store.open(copy)


def test_graphbolt_typed_nan_label_is_refused_naming_the_metadata(tmp_path):
    from gnnssd.datasets.graphbolt_hetero import GraphBoltHeteroSource
    from tests.hetero_graph import ToyHeteroSource
    from tests.datasets.test_graphbolt_hetero import _write_layout

    root = tmp_path / "gb"
    _write_layout(root, ToyHeteroSource())
    labels = root / "train-labels.npy"
    values = np.load(labels).astype(np.float64)
    values[0] = np.nan
    np.save(labels, values)
    with pytest.raises(DatasetError, match=r"metadata\.yaml: .*labels: entry 0 is nan"):
        GraphBoltHeteroSource(root).load_labels()


# --- partial: a loader is per process -------------------------------------------------------

def test_loader_pickled_or_used_after_fork_says_a_loader_is_per_process(store, tmp_path):
    import os

    loader = NodeLoader(store, Store.open(store).train_idx, fanouts=[2, 2], batch_size=16, features="ssd",
                        scratch_dir=tmp_path)
    try:
        with pytest.raises(TypeError, match="cannot be pickled: .*A loader is per process"):
            pickle.dumps(loader)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: iterating must refuse, not hang or die silently
            try:
                next(iter(loader))
                os.write(write, b"iterated")
            except RuntimeError as exc:
                os.write(write, str(exc).encode()[:500])
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        os.close(write)
        said = os.read(read, 1000).decode()
        assert "cannot be used in process" in said and "A loader is per process" in said, said
    finally:
        loader.close()


# --- partial: two threads on one loader ---------------------------------------------------

@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_a_second_thread_iterating_a_source_in_use_is_refused_by_name(store, tmp_path, features):
    """An iteration running in one thread (here suspended after its first mini-batch) and
    the same loader, or another over its source, iterated in a second thread: the second is
    refused naming why (not Python's 'generator already executing'); once the first ends, the
    other thread may iterate, and loaders of one source still interleave in one thread."""
    import threading

    loader = NodeLoader(store, Store.open(store).train_idx, fanouts=[2, 2], batch_size=16, features=features,
                        scratch_dir=tmp_path)
    other = loader.with_seeds(Store.open(store).test_idx, fanouts=[2, 2], batch_size=16)
    try:
        running = iter(loader)
        next(running)
        next(iter(other))  # the same thread: interleaving is fine
        said: list[str] = []

        def second_thread(which) -> None:
            try:
                next(iter(which))
                said.append("iterated")
            except RuntimeError as exc:
                said.append(str(exc))

        for which in (loader, other):
            thread = threading.Thread(target=second_thread, args=(which,))
            thread.start()
            thread.join()
        assert len(said) == 2 and all("is being iterated in another thread" in s and "its own loader" in s
                                      for s in said), said
        running.close()
        thread = threading.Thread(target=second_thread, args=(loader,))
        thread.start()
        thread.join()
        assert said[-1] == "iterated"
    finally:
        other.close()
        loader.close()


# --- partial: scratch left in the temp directory by a killed process -----------------------

def test_scratch_a_killed_process_left_in_the_temp_directory_is_removed(store, tmp_path, monkeypatch):
    """A dead pid's gnnssd-scratch-* folder, untouched for long, goes when a source makes its
    own; a live pid's, a recent one, a link and a folder of another name stay."""
    import subprocess
    import sys
    import tempfile

    from gnnssd.loading import feature_source

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    old = time.time() - 2 * feature_source.STALE_SCRATCH_S
    made = {}
    for name, pid, age in (("stale", dead, old), ("recent", dead, time.time()), ("live", str(os.getpid()), old)):
        folder = made[name] = tmp_path / f"gnnssd-scratch-{pid}-{name}"
        (folder / "blocks").mkdir(parents=True)
        os.utime(folder, (age, age))
    target = tmp_path / "users-own"
    target.mkdir()
    (tmp_path / f"gnnssd-scratch-{dead}-link").symlink_to(target)
    os.utime(tmp_path / f"gnnssd-scratch-{dead}-link", (old, old), follow_symlinks=False)
    loader = NodeLoader(store, Store.open(store).train_idx, fanouts=[2, 2], batch_size=16, features="ssd")
    try:
        assert not made["stale"].exists()
        assert made["recent"].exists() and made["live"].exists() and target.exists()
        assert (tmp_path / f"gnnssd-scratch-{dead}-link").is_symlink()
        assert len(list(tmp_path.glob(f"gnnssd-scratch-{os.getpid()}-*"))) == 2  # "live" and its own
    finally:
        loader.close()
    assert len(list(tmp_path.glob(f"gnnssd-scratch-{os.getpid()}-*"))) == 1  # its own removed on close
