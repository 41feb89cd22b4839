"""Fault cases of issue 48 on bounded inputs, arguments and the environment: every YAML
through the bounded loader, the .pt reader's allocations bounded by what the file holds,
checkpoints read in chunks within a bound that follows the model and checked for their
tree's shape, epochs and fanouts checked by one checker, the torchrun and gnnssd
environment variables named when wrong, a loader closed mid-epoch, a store replaced under
a live run.

Each test is named after the fault it covers; stores and files are tiny and made here
(a sparse file stands for a large one).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnssd
from gnnssd.cli.commands import main
from gnnssd.core.config import ConfigError, config_from_dict, load_config
from gnnssd.storage_format import DatasetError
from gnnssd.training.checkpoint import CheckpointError
from tests.conftest import REPO
from tests.faults.test_hostile_inputs import _alias_bomb
from tests.faults.test_run import _assert_one_line_error, _config_file, _data, _store, _train


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return _store(tmp_path_factory.mktemp("bounded") / "store")


@pytest.fixture(scope="module")
def trained_run(store, tmp_path_factory) -> Path:
    """A run directory with the checkpoint of one epoch (copied by the tests that edit it)."""
    run_dir = tmp_path_factory.mktemp("bounded-run") / "run"
    _train(store, run_dir)
    return run_dir


def _run_copy(trained_run: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    return run_dir


# --- fault 5: the torchrun and gnnssd environment ----------------------------------------------

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"}


def test_torchrun_world_size_0_is_refused_naming_it_not_a_segfault(store, tmp_path):
    """RANK=0 WORLD_SIZE=0 crashed torch's store creation (SIGSEGV)."""
    config = _config_file(store, tmp_path / "run")
    done = subprocess.run([sys.executable, "-m", "gnnssd", "train", "--config", str(config)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, **TORCHRUN, "WORLD_SIZE": "0"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "environment variable WORLD_SIZE='0': expected an integer from 1" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, value, expected", [
    ("RANK", "abc", "expected an integer from 0 to 0 (below WORLD_SIZE=1)"),
    ("LOCAL_RANK", "zz", "below LOCAL_WORLD_SIZE=1"),
    ("LOCAL_WORLD_SIZE", "-3", "at most WORLD_SIZE=1"),
    ("MASTER_PORT", "99999", "expected an integer from 1 to 65,535"),
    ("MASTER_PORT", "x", "expected an integer from 1 to 65,535"),
    ("GNNSSD_DIST_TIMEOUT", "inf", "a number of seconds from"),
    ("GNNSSD_DIST_TIMEOUT", "nan", "a number of seconds from"),
])
def test_bad_torchrun_or_gnnssd_variable_is_named_with_its_value(monkeypatch, name, value, expected):
    """RANK=abc was "invalid literal for int()", GNNSSD_DIST_TIMEOUT=inf an OverflowError:
    each variable is checked before torch's rendezvous reads it."""
    from gnnssd.training.distributed import init_from_env

    for key, default in TORCHRUN.items():
        monkeypatch.setenv(key, default)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"environment variable {name}=.{value}.: .*{re.escape(expected)}"):
        init_from_env()


def test_numba_num_threads_0_is_named_not_numba_traceback():
    """numba fails its own import on NUMBA_NUM_THREADS=0 ("Number of threads specified
    must be > 0"), naming no variable: gnnssd checks it before importing numba."""
    done = subprocess.run([sys.executable, "-c", "import gnnssd.storage_format"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "NUMBA_NUM_THREADS": "0"})
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith(
        "environment variable NUMBA_NUM_THREADS='0': expected an integer from 1 to 4,096"), done.stderr[-2000:]


# --- fault 6: YAML outside the bounded loader; unbounded reprs ---------------------------------

def _flow_alias_bomb(levels: int = 7) -> str:
    """_alias_bomb as one YAML flow mapping (one command-line word): 9**levels strings."""
    names = "abcdefghi"[:levels]
    parts = ["a: &a [" + ",".join(['"lol"'] * 9) + "]"]
    parts += [f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]" for prev, name in zip(names, names[1:])]
    return "{" + ", ".join(parts) + "}"


@pytest.mark.parametrize("value, needles", [
    (_flow_alias_bomb(), ["train.lr: not valid YAML:", "alias bomb"]),
    ("[" * 5000 + "]" * 5000, ["train.lr: not valid YAML:", "nested deeper"]),
    ("1" * 5000, ["train.lr: not valid YAML:", "digits"]),
])
def test_set_value_goes_through_the_bounded_yaml_loader(store, tmp_path, capsys, value, needles):
    """`--set train.lr=...` was parsed by yaml.safe_load: 403 bytes of aliases hung the
    command; nesting and a 5,000-digit integer ended in errors naming no key."""
    config = _config_file(store, tmp_path / "run")
    code, err = main(["train", "--config", str(config), "--set", f"train.lr={value}"]), capsys.readouterr().err
    _assert_one_line_error(code, err, *needles)
    assert len(err) < 2000


def test_set_given_twice_is_refused_naming_the_key(store, tmp_path, capsys):
    """`--set train.lr=1 --set train.lr=2` took the last value silently."""
    config = _config_file(store, tmp_path / "run")
    code = main(["train", "--config", str(config), "--set", "train.lr=0.1", "--set", "train.lr=0.5"])
    _assert_one_line_error(code, capsys.readouterr().err, "train.lr: --set given twice (0.1, then '0.5')")
    assert not (tmp_path / "run").exists()


def test_config_integer_of_5000_digits_is_a_config_error_naming_the_file(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("store: s\nrun_dir: r\nseed: " + "7" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"big\.yaml: not valid YAML: .*digits"):
        load_config(config)


@pytest.mark.parametrize("text, message", [
    (_alias_bomb(), "alias bomb"),
    ("graph: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper"),
])
def test_graphbolt_metadata_goes_through_the_bounded_yaml_loader(tmp_path, text, message):
    """519 bytes of aliases in metadata.yaml ended in MemoryError or a hang (yaml.safe_load,
    then the error path built the value's whole repr); deep nesting in a RecursionError."""
    from gnnssd.datasets import GraphBoltSource

    (tmp_path / "gb").mkdir()
    (tmp_path / "gb" / "metadata.yaml").write_text(text)
    with pytest.raises(DatasetError, match=rf"metadata\.yaml: not valid YAML: .*{message}") as error:
        GraphBoltSource(tmp_path / "gb")
    assert len(str(error.value)) < 2000


def test_error_quoting_a_huge_value_never_builds_its_whole_repr():
    """A value expanding to far more text than it takes in memory, or an integer past
    Python's conversion limit, is quoted in a bounded form (`{value!r:.100}` and config's
    cut repr built it whole first)."""
    from gnnssd.storage_format import shown

    big = ["x" * (1 << 20)] * 256  # 256 MiB as text, 1 MiB in memory
    text = shown(big)
    assert text.startswith("['xxx") and text.endswith("(too large to quote whole)") and len(text) < 300
    assert shown(10**6000) == "<an integer of 19,932 bits>... (too large to quote whole)"
    with pytest.raises(ConfigError, match=r"seed: \['x+.*too large to quote whole\) is invalid"):
        config_from_dict({"store": "s", "run_dir": "r", "seed": big})


# --- fault 7: the .pt reader's allocations --------------------------------------------------------

def _pt_file(path: Path, pickle_bytes: bytes, members: dict[str, bytes] | None = None,
             compress: int = zipfile.ZIP_STORED) -> Path:
    """A torch zip file whose data.pkl is `pickle_bytes` (crafted: torch.save would not write it)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle_bytes, compress_type=compress)
        archive.writestr("archive/byteorder", b"little")
        for name, data in (members or {}).items():
            archive.writestr(f"archive/data/{name}", data)
    return path


def _declare_size(path: Path, member: str, size: int) -> None:
    """Make the zip's central directory record `size` uncompressed bytes for `member` (as a
    DEFLATE member of 1 GiB in 1 MiB does), without writing them."""
    raw = bytearray(path.read_bytes())
    entry = raw.index(b"PK\x01\x02")
    while raw[entry + 46: entry + 46 + struct.unpack_from("<H", raw, entry + 28)[0]] != member.encode():
        entry = raw.index(b"PK\x01\x02", entry + 46)
    struct.pack_into("<I", raw, entry + 24, size)
    path.write_bytes(raw)


class _Reduce:
    """Pickles as `function(*args)` (a REDUCE the reader must bound), without calling it."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def test_pt_stride_0_view_of_2_40_elements_is_refused(tmp_path):
    """A 600-byte split_dict.pt of torch.zeros(1).expand(2**40): the view was returned, and
    preprocess's copy of it asked for 8 TiB."""
    from gnnssd.datasets.torch_file import load_torch_file

    path = tmp_path / "split_dict.pt"
    torch.save({"train": torch.zeros(1, dtype=torch.int64).expand(2**40)}, path)
    assert path.stat().st_size < 2000
    with pytest.raises(DatasetError, match=r"split_dict\.pt: .*more elements than its storage holds"):
        load_torch_file(path)


def test_pt_data_pkl_past_its_bound_is_refused_uninflated(tmp_path):
    """data.pkl recording 1 GiB uncompressed (a DEFLATE member of 1 GiB in 1 MiB was
    inflated whole): refused by its recorded size, before any of it is decompressed."""
    from gnnssd.datasets.torch_file import load_torch_file

    path = _pt_file(tmp_path / "meta.pt", pickle.dumps({"paper": 5}, protocol=2), compress=zipfile.ZIP_DEFLATED)
    _declare_size(path, "archive/data.pkl", 1 << 30)
    with pytest.raises(DatasetError, match=r"meta\.pt: its member archive/data\.pkl is 1,073,741,824 bytes "
                                           r"uncompressed, more than the"):
        load_torch_file(path)


@pytest.mark.parametrize("case", ["binbytes8", "ndarray", "reconstruct", "nested"])
def test_pt_pickle_naming_a_huge_allocation_or_deep_nesting_names_the_file(tmp_path, case):
    """BINBYTES8 of 2**62 bytes and numpy.ndarray((2**40,)) by REDUCE ended in MemoryError
    tracebacks; 100,000 nested lists in a RecursionError."""
    from gnnssd.datasets.torch_file import load_torch_file

    data = {
        "binbytes8": b"\x80\x04\x8e" + (1 << 62).to_bytes(8, "little") + b"x" * 16 + b".",
        "ndarray": pickle.dumps(_Reduce(np.ndarray, (2**40,)), protocol=2),
        "reconstruct": pickle.dumps(_Reduce(np.core.multiarray._reconstruct, np.ndarray, (2**40,), b"b"),
                                    protocol=2),
        "nested": b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b".",
    }[case]
    path = _pt_file(tmp_path / "split_dict.pt", data)
    with pytest.raises(DatasetError, match=r"split_dict\.pt: "):
        load_torch_file(path)


def test_pt_arrays_pickled_inline_still_load(tmp_path):
    """The bounds refuse no honest file: NumPy arrays pickled in data.pkl (as MAG240M's
    split_dict.pt holds them) and expanded views within their storage load as before."""
    from gnnssd.datasets.torch_file import load_torch_file

    value = {"train": np.arange(1000, dtype=np.int64), "t": torch.arange(6).reshape(2, 3)[:, 1]}
    torch.save(value, tmp_path / "split_dict.pt")
    read = load_torch_file(tmp_path / "split_dict.pt")
    np.testing.assert_array_equal(read["train"], value["train"])
    np.testing.assert_array_equal(read["t"], value["t"].numpy())


# --- fault 8: checkpoints: a bound that follows the model, read in chunks, the tree's shape -----

def test_sparse_checkpoint_far_past_its_model_is_refused_unread(store, trained_run, tmp_path):
    """A sparse checkpoint.pt of 64 GiB: it was read into one buffer before its SHA-256
    (MemoryError); now a checkpoint may be at most what one of this model can be."""
    run_dir = _run_copy(trained_run, tmp_path)
    path = run_dir / "checkpoint.pt"
    os.truncate(path, 64 << 30)
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt: 68,719,476,736 bytes, more than the [\d,]+ a "
                                              r"checkpoint of this run's model"):
        _train(store, run_dir, resume=True, train={"epochs": 2})


def test_checkpoint_is_hashed_as_it_is_read_and_still_loads(trained_run, tmp_path):
    """The chunked reader against the bytes: the tensors as saved, and a flipped byte in the
    header (not only in the tensors) reported as corruption."""
    from gnnssd.training.checkpoint import load_checkpoint
    from gnnssd.training.state_file import decode_state

    run_dir = _run_copy(trained_run, tmp_path)
    raw = (run_dir / "checkpoint.pt").read_bytes()
    state = load_checkpoint(run_dir)
    for name, tensor in decode_state(raw)["model"].items():
        assert torch.equal(state["model"][name], tensor)
    damaged = bytearray(raw)
    damaged[30] ^= 0x01  # inside the JSON header
    (run_dir / "checkpoint.pt").write_bytes(damaged)
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt: not a usable gnnssd checkpoint: corrupt"):
        load_checkpoint(run_dir)


def test_checkpoint_header_nested_too_deep_is_named(tmp_path):
    """A valid digest over a JSON header nested 100,000 deep: RecursionError before."""
    from gnnssd.training.checkpoint import load_checkpoint
    from gnnssd.training.state_file import MAGIC

    header = b'{"tree": ' + b"[" * 100_000 + b"]" * 100_000 + b', "tensors": []}'
    body = MAGIC + len(header).to_bytes(8, "little") + header
    (tmp_path / "checkpoint.pt").write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt: not a usable gnnssd checkpoint: .*nested deeper"):
        load_checkpoint(tmp_path)


def _edit(key: str, value):
    def edit(state: dict) -> None:
        *parents, last = key.split(".")
        node = state
        for part in parents:
            node = node[part]
        node[last] = value(node[last]) if callable(value) else value
    return edit


@pytest.mark.parametrize("key, value, named", [
    ("config", ["a", "list"], "config"),
    ("config", "{not json", "config"),
    ("rng.torch", torch.zeros(3, dtype=torch.uint8), "rng.torch"),
    ("rng.numpy", [1, 2, 3], "rng.numpy"),
    ("rng", "seeded", "rng"),
    ("best", {}, "best"),
    ("best.epoch", 99, "best.epoch"),
    ("best.state", [1], "best.state"),
    ("best.valid_acc", "high", "best.valid_acc"),
    ("optimizer", {"state": []}, "optimizer"),
    ("model", [torch.zeros(1)], "model"),
    ("world_size", "2", "world_size"),
    ("store", 5, "store"),
])
def test_checkpoint_tree_of_the_wrong_shape_names_the_key_and_file(store, trained_run, tmp_path, key, value, named):
    """Trees of the wrong shape (config a list, rng 3 bytes, best without keys, ...) ended in
    tracebacks from json, torch or NumPy naming no file."""
    from gnnssd.training.checkpoint import load_checkpoint, save_checkpoint

    run_dir = _run_copy(trained_run, tmp_path)
    state = load_checkpoint(run_dir)
    _edit(key, value)(state)
    save_checkpoint(run_dir, state)
    with pytest.raises(CheckpointError, match=rf"checkpoint\.pt: key '{named}' is "):
        _train(store, run_dir, resume=True, train={"epochs": 2})


# --- fault 10: epochs and fanouts ----------------------------------------------------------------

@pytest.mark.parametrize("features", ["memory", "ssd"])
def test_set_epoch_takes_numpy_integers_and_refuses_the_rest_by_name(store, features):
    """set_epoch(np.int64(4)) died in DGL's C++; -1, 1.5, "3", None, nan failed deep without
    the argument named, and 2**70 overflowed in ssd mode."""
    with gnnssd.NodeLoader(store, gnnssd.Store.open(store).train_idx, fanouts=[4, 4], batch_size=32,
                           features=features, memory_budget="64MiB", shuffle=True, seed=3) as loader:
        loader.set_epoch(np.int64(4))
        numpy_epoch = [mb.output_nodes for mb in loader]
        loader.set_epoch(4)
        assert all(torch.equal(a, b.output_nodes) for a, b in zip(numpy_epoch, loader, strict=True))
        for bad in (-1, 1.5, "3", None, float("nan"), 2**70, True):
            with pytest.raises(ValueError, match=r"set_epoch: epoch: .* expected an integer from 0 to 2,147,483,647"):
                loader.set_epoch(bad)


@pytest.mark.parametrize("option, value", [("first_epoch", -1), ("first_epoch", 1.5), ("reuse_epochs", "3"),
                                           ("reuse_epochs", None), ("reuse_epochs", 2**70)])
def test_loader_epoch_options_are_checked_by_name(store, option, value):
    with pytest.raises(ValueError, match=rf"{option}: .*expected an integer from"):
        gnnssd.NodeLoader(store, np.arange(10), fanouts=[4, 4], batch_size=8, **{option: value})


def test_fanout_of_10_30_is_refused_naming_the_key(store):
    """A fanout of 10**30 overflowed in the sampler, unnamed."""
    with pytest.raises(ValueError, match=r"fanouts: \[1000000000000000000000000000000, 2\]; expected .* up to "
                                         r"2,147,483,647"):
        gnnssd.NodeLoader(store, np.arange(10), fanouts=[10**30, 2], batch_size=8)
    with pytest.raises(ValueError, match=r"batch_size: '8'; expected an integer from 1"):
        gnnssd.EdgeLoader(store, np.zeros((2, 1), np.int64), fanouts=[4, 4], batch_size="8")
    for key, fanouts in (("fanouts", [10**30, 2]), ("eval_fanouts", [4, {"r": 10**30}])):
        with pytest.raises(ConfigError, match=rf"sampler\.{key}: .* is invalid; expected .* up to 2,147,483,647"):
            config_from_dict(_data(store, Path("r"), sampler={key: fanouts}))


def test_epochs_past_the_bound_are_a_config_error(store):
    for section, key in (("train", "epochs"), ("sampler", "reuse_epochs")):
        with pytest.raises(ConfigError, match=rf"{section}\.{key}: 1180591620717411303424 is invalid; expected an "
                                              r"integer from 1 to 2,147,483,647"):
            config_from_dict(_data(store, Path("r"), **{section: {key: 2**70}}))


# --- partial: close() mid-epoch; a store replaced under a live run -----------------------------

@pytest.mark.parametrize("features", ["memory", "ssd"])
@pytest.mark.parametrize("closed", ["loader", "source"])
def test_close_mid_epoch_ends_the_iterator_with_a_clear_error(store, features, closed):
    """Memory mode's iterator kept yielding from a closed loader, ssd's ended as if the
    epoch were whole."""
    source = gnnssd.FeatureSource.from_options(store, features=features, memory_budget="64MiB",
                                               fanouts=[4, 4], batch_size=8)
    loader = gnnssd.NodeLoader(source, gnnssd.Store.open(store).train_idx, fanouts=[4, 4], batch_size=8)
    batches = iter(loader)
    next(batches)
    (loader if closed == "loader" else source).close()
    name = "this NodeLoader" if closed == "loader" else "the FeatureSource of this loader"
    with pytest.raises(RuntimeError, match=f"{name} was closed during an epoch"):
        next(batches)
    source.close()


def test_store_replaced_under_a_live_run_stops_it_before_its_checkpoint(store, tmp_path):
    """A store preprocessed again into the same folder while a run trained on it: the run
    went on reading the new one and checkpointed a mix of both; now it stops, naming the
    store, and writes nothing (to the run or the new store)."""
    from gnnssd.storage_format import StoreError
    from gnnssd.training.tasks import Trainer

    own = tmp_path / "store"
    shutil.copytree(store, own)
    trainer = Trainer(config_from_dict(_data(own, tmp_path / "run", train={"epochs": 2})))
    train_epoch, replaced = trainer._train_epoch, {}

    def replace_during_the_epoch(epoch: int) -> dict:
        record = train_epoch(epoch)
        if epoch == 1:
            shutil.rmtree(own)
            _store(own, seed=7)
            replaced.update((p.name, p.stat().st_mtime_ns) for p in own.iterdir())
        return record

    trainer._train_epoch = replace_during_the_epoch
    try:
        with pytest.raises(StoreError, match=rf"store: {own} was replaced while this run trained on it .* the "
                                             r"checkpoint of epoch 0 .* is kept"):
            trainer.fit()
    finally:
        trainer.close()
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    assert dict((p.name, p.stat().st_mtime_ns) for p in own.iterdir()) == replaced  # nothing written to it
