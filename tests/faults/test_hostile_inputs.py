"""Fault cases of issue 24 (reliability, round 2): input files that must not run code or
exhaust memory, stores whose checksums are valid but whose content is not, and run
directories a hostile user prepared. Each test is named after its fault."""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from gnnssd.core.config import ConfigError, config_from_dict, load_config
from gnnssd.datasets import PlanetoidSource
from gnnssd.datasets.arrays import ArraySource
from gnnssd.storage_format import DatasetError, Store, StoreError, write_store
from gnnssd.storage_format.atomic import UnsafeOutputError, atomic_file, crc32_of_file
from gnnssd.storage_format.manifest import MANIFEST, ROW_SCALES, manifest_checksum
from gnnssd.training.rundir import LOCK, SCRATCH, RunLock, Scratch
from tests.conftest import random_graph_arrays


def _planetoid_copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for file in src.glob("ind.cora.*"):
        shutil.copy(file, dst / file.name)
    return dst


class _RunsCommand:
    """Unpickling this calls os.system: what a crafted Planetoid file does."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_planetoid_pickle_naming_os_system_is_refused_without_running(tmp_path, planetoid_root):
    root = _planetoid_copy(planetoid_root, tmp_path / "planetoid")
    marker = tmp_path / "ran"
    (root / "ind.cora.x").write_bytes(pickle.dumps(_RunsCommand(f"touch {marker}"), protocol=2))
    with pytest.raises(DatasetError, match=r"ind\.cora\.x: .*refused to load posix\.system"):
        PlanetoidSource(root, "cora")
    assert not marker.exists()


def test_planetoid_test_index_of_1e11_is_refused_before_allocating(tmp_path, planetoid_root):
    root = _planetoid_copy(planetoid_root, tmp_path / "planetoid")
    index = np.loadtxt(root / "ind.cora.test.index", dtype=np.int64)
    index[-1] = 10**11
    np.savetxt(root / "ind.cora.test.index", index, fmt="%d")
    with pytest.raises(DatasetError, match=r"ind\.cora\.test\.index: indices 1708\.\.100000000000"):
        PlanetoidSource(root, "cora")


# --- stores whose checksums are valid but whose content is not ---------------------------

def _tamper(store_dir: Path, name: str, array: np.ndarray) -> None:
    """Replace `name` with `array` and recompute its CRC-32, size and the manifest's own
    checksum as preprocess does: a store that every checksum vouches for."""
    file = store_dir / name
    with open(file, "wb") as f:
        np.save(f, array)
    manifest = json.loads((store_dir / MANIFEST).read_text())
    manifest["files"][name].update(size=file.stat().st_size, crc32=crc32_of_file(file))
    manifest["checksum"] = manifest_checksum(manifest)
    (store_dir / MANIFEST).write_text(json.dumps(manifest))


def _array(store_dir: Path, name: str) -> np.ndarray:
    return np.load(store_dir / name).copy()


def _set(index, value):
    def edit(a):
        a[index] = value
        return a
    return edit


# (file, edit, which check stops it, what the message says)
CONTENT_FAULTS = {
    "indptr not monotone": ("indptr.npy", lambda a: _set(10, int(a[9]) - 1)(a), "open",
                            r"decreases at node 9"),
    "indptr[10] = 1e9": ("indptr.npy", _set(10, 10**9), "open", r"decreases at node 10"),
    "indptr[0] = 3": ("indptr.npy", _set(0, 3), "open", r"starts at 3"),
    "indices[5] = 10**6": ("indices.npy", _set(5, 10**6), "verify", r"entry 5 is 1000000"),
    "indices[5] = -3": ("indices.npy", _set(5, -3), "verify", r"entry 5 is -3"),
    "indices big-endian": ("indices.npy", lambda a: a.astype(a.dtype.newbyteorder(">")), "open",
                           r"dtype >i"),
    "train_idx out of range": ("train_idx.npy", _set(0, 10**6), "open", r"entry 0 is 1000000"),
    "train_idx -1": ("train_idx.npy", _set(0, -1), "open", r"entry 0 is -1"),
    "train_idx float": ("train_idx.npy", lambda a: a.astype(np.float64), "open", r"dtype <f8"),
    "inv[0] = 10**7": ("inv.npy", _set(0, 10**7), "open", r"entry 0 is 10000000"),
    "perm not a permutation": ("perm.npy", lambda a: _set(0, int(a[1]))(a), "open",
                               r"expected perm and inv to be inverse permutations"),
    "label -5": ("labels.npy", _set(3, -5), "open", r"entry 3 is -5"),
    "train_idx repeated": ("train_idx.npy", lambda a: _set(1, int(a[0]))(a), "verify",
                           r"1 repeated node ID"),
}


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("clean") / "store",
                       ArraySource(**random_graph_arrays(seed=3)))


@pytest.mark.parametrize("fault", sorted(CONTENT_FAULTS))
def test_store_content_with_valid_checksums_is_refused_naming_the_file(tmp_path, clean_store, fault):
    name, edit, stage, message = CONTENT_FAULTS[fault]
    store_dir = tmp_path / "store"
    shutil.copytree(clean_store, store_dir)
    _tamper(store_dir, name, edit(_array(store_dir, name)))
    with pytest.raises(StoreError, match=rf"{re.escape(name)}: .*{message}"):
        Store.open(store_dir).verify()
    if stage == "verify":  # open's cheap checks let it through; verify stops it
        Store.open(store_dir)


def test_float_link_edges_are_refused_at_open(tmp_path, clean_store):
    store_dir = write_store(tmp_path / "link", ArraySource(**random_graph_arrays(seed=4)),
                            edge_split=(0.8, 0.1, 0.1))
    _tamper(store_dir, "link_test.npy", _array(store_dir, "link_test.npy").astype(np.float64) + 0.5)
    with pytest.raises(StoreError, match=r"link_test\.npy: dtype <f8 with 2 dimension"):
        Store.open(store_dir)


def test_int8_store_with_nan_scales_fails_verify(tmp_path):
    store_dir = write_store(tmp_path / "int8", ArraySource(**random_graph_arrays(seed=5)), dtype="int8")
    file = store_dir / ROW_SCALES
    scales = np.fromfile(file, dtype="<f4")
    scales[6] = np.nan
    scales.tofile(file)
    manifest = json.loads((store_dir / MANIFEST).read_text())
    manifest["files"][ROW_SCALES]["crc32"] = crc32_of_file(file)
    manifest["checksum"] = manifest_checksum(manifest)
    (store_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=r"features\.scale: row 3 holds \[.*nan.*\], expected finite"):
        Store.open(store_dir).verify()


# --- the sampler's kernels bound-check what they index -----------------------------------

SAMPLER_FAULTS = {
    "seed n+5": ("seeds = np.array([n + 5])", r"node 305: not a node of the graph"),
    "seed 10**12": ("seeds = np.array([10**12])", r"node 1000000000000: not a node"),
    "seed -3": ("seeds = np.array([-3])", r"node -3: not a node"),
    "indptr not monotone": ("indptr[10] = indptr[9] - 1; seeds = np.array([9])",
                            r"node 9: indptr gives its in-edges as .* reversed"),
    "indptr[10] = 1e9": ("indptr[10] = 10**9; seeds = np.array([10])",
                         r"node 10: indptr gives its in-edges as 1000000000"),
    "indices 10**6": ("indices[:] = 10**6; seeds = np.arange(20)",
                      r"sampled in-neighbour 1000000: not a node"),
    "indices -3": ("indices[:] = -3; seeds = np.arange(20)", r"sampled in-neighbour -3: not a node"),
    "fanout -5": ("fanouts = [-5, 3]", r"fanouts \[-5, 3\]: expected -1"),
}

SAMPLER_SCRIPT = """
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from gnnssd.sampler.sampling import NeighborSampler
from gnnssd.storage_format.preprocess.csc import csc_from_edges
rng = np.random.default_rng(0)
n = 300
indptr, indices = csc_from_edges(rng.integers(n, size=2000), rng.integers(n, size=2000), n)
indptr, indices = np.array(indptr, np.int64), np.array(indices)
seeds, fanouts = np.arange(20), [5, 5]
{fault}
try:
    NeighborSampler(indptr, indices, fanouts).sample(seeds, seed=0)
except (IndexError, ValueError) as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("fault", sorted(SAMPLER_FAULTS))
def test_sampler_bound_checks_what_it_indexes(fault):
    """In a subprocess: an out-of-bounds write would crash it rather than pytest."""
    code, message = SAMPLER_FAULTS[fault]
    run = subprocess.run([sys.executable, "-c", SAMPLER_SCRIPT.format(fault=code)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(rf"refused: {message}", run.stdout), run.stdout + run.stderr[-2000:]


# --- the configuration --------------------------------------------------------------------

@pytest.mark.parametrize("eval_fanouts", [[0, -7], [0, -2], [5, 0]])
def test_eval_fanouts_that_are_not_fanouts_are_refused_by_name(eval_fanouts):
    data = {"store": "s", "run_dir": "r", "sampler": {"eval_fanouts": eval_fanouts}}
    with pytest.raises(ConfigError, match=rf"sampler\.eval_fanouts: {re.escape(repr(eval_fanouts))} "
                                          r"is invalid; expected a non-empty list of positive"):
        config_from_dict(data)


def _alias_bomb(levels: int = 7) -> str:
    """The 'billion laughs': each level lists the previous one 9 times (9**levels strings)."""
    names = "abcdefghi"[:levels]
    lines = ["lol: &a [" + ",".join(['"lol"'] * 9) + "]"]
    lines += [f"x{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]"
              for prev, name in zip(names, names[1:])]
    return "\n".join(lines) + f"\nstore: s\nrun_dir: r\nseed: *{names[-1]}\n"


def test_yaml_alias_bomb_is_refused_with_a_short_message(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(_alias_bomb())
    assert len(config.read_bytes()) < 1000
    with pytest.raises(ConfigError, match=r"bomb\.yaml: not valid YAML: .*alias bomb") as error:
        load_config(config)
    assert len(str(error.value)) < 2000


def test_a_huge_value_is_not_echoed_in_the_error(tmp_path):
    config = tmp_path / "long.yaml"
    config.write_text("store: s\nrun_dir: r\nseed: [" + ",".join(["1"] * 50_000) + "]\n")
    with pytest.raises(ConfigError, match=r"seed: \[1, 1, .*\.\.\. \(150,000 characters\) is invalid") as error:
        load_config(config)
    assert len(str(error.value)) < 1000


def test_duplicate_yaml_keys_are_refused(tmp_path):
    config = tmp_path / "dup.yaml"
    config.write_text("store: s\nrun_dir: r\ntrain:\n  lr: 0.1\n  lr: 0.5\n")
    with pytest.raises(ConfigError, match=r"(?s)dup\.yaml: not valid YAML: duplicate key 'lr'.*line 5"):
        load_config(config)


def test_non_utf8_config_names_the_file(tmp_path):
    config = tmp_path / "latin.yaml"
    config.write_bytes("store: café\nrun_dir: r\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin\.yaml: not UTF-8 text \(byte 0xe9 at offset 10\)"):
        load_config(config)


# --- run directories prepared by someone else ----------------------------------------------

def test_scratch_symlink_in_run_dir_is_refused_and_its_target_untouched(tmp_path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    (elsewhere / "keep").mkdir(parents=True)
    (elsewhere / "keep" / "data").write_text("precious")
    (run_dir / SCRATCH).symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"\.gnnssd-scratch is a symbolic link"):
        Scratch(run_dir).clear_stale()
    assert (elsewhere / "keep" / "data").read_text() == "precious"


def test_stale_scratch_entry_that_is_a_symlink_is_unlinked_not_followed(tmp_path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run_dir / SCRATCH).mkdir(parents=True)
    (elsewhere / "keep").mkdir(parents=True)
    (elsewhere / "keep" / "data").write_text("precious")
    (run_dir / SCRATCH / "123-abcd").symlink_to(elsewhere / "keep")
    (run_dir / SCRATCH / "456-ef01").mkdir()
    Scratch(run_dir).clear_stale()
    assert list((run_dir / SCRATCH).iterdir()) == []
    assert (elsewhere / "keep" / "data").read_text() == "precious"


@pytest.mark.parametrize("exclusive", [True, False])
@pytest.mark.parametrize("planted", ["symlink", "hard link"])
def test_lock_file_planted_as_a_link_is_refused_untruncated(tmp_path, exclusive, planted):
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("precious")
    if planted == "symlink":
        (run_dir / LOCK).symlink_to(victim)
    else:
        os.link(victim, run_dir / LOCK)
    with pytest.raises(ConfigError, match=r"\.gnnssd-lock (is a symbolic link|is not a plain file)"):
        RunLock(run_dir, exclusive=exclusive)
    assert victim.read_text() == "precious"


def test_run_config_symlink_is_refused_not_written_through(tmp_path):
    from gnnssd.training.rundir import write_run_file
    run_dir, victim = tmp_path / "run", tmp_path / "victim.txt"
    run_dir.mkdir()
    victim.write_text("precious")
    (run_dir / "run_config.yaml").symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match=r"run_config\.yaml: is a symbolic link"):
        write_run_file(run_dir / "run_config.yaml", "seed: 1\n")
    assert victim.read_text() == "precious"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_read_only_run_dir_takes_a_read_only_shared_lock(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunLock(run_dir, exclusive=True).release()
    run_dir.chmod(0o555)
    (run_dir / LOCK).chmod(0o444)
    try:
        reader = RunLock(run_dir, exclusive=False)
        reader.release()
    finally:
        run_dir.chmod(0o755)


# --- fuzz: arrays tampered within valid checksums ------------------------------------------

FUZZ_ARRAYS = ("indptr", "indices", "labels", "perm", "inv", "train_idx", "valid_idx", "test_idx")
FUZZ_VALUES = (-(2**40), -3, -1, 0, 1, 299, 300, 305, 10**6, 10**9, 2**31, 2**62)

FUZZ_SCRIPT = """
import sys
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from gnnssd import NodeLoader
from gnnssd.core.config import config_from_dict
from gnnssd.storage_format import Store, StoreError
from gnnssd.training.tasks import Trainer
CLEAR = (StoreError, IndexError, ValueError)
for path in sys.argv[1:]:
    print("store", path, flush=True)
    try:
        store = Store.open(path)
    except StoreError as exc:
        print("open refused:", exc, flush=True)
        continue
    try:
        store.verify()
        print("verify passed", flush=True)
    except StoreError as exc:
        print("verify refused:", exc, flush=True)
    for features in ("memory", "ssd"):
        try:
            with NodeLoader(store, store.train_idx, fanouts=[3, 3], batch_size=64, features=features,
                            memory_budget="32MiB", shuffle=True, seed=0) as loader:
                for mb in loader:
                    pass
            print(features, "loaded", flush=True)
        except CLEAR as exc:
            print(features, "refused:", type(exc).__name__, str(exc).splitlines()[0][:300], flush=True)
    try:  # predict: every node through the evaluation loader and the model, indexed by node ID
        config = config_from_dict({"store": path, "run_dir": path + "-run", "model": {"hidden": 8},
                                   "sampler": {"fanouts": [3, 3], "batch_size": 64},
                                   "train": {"epochs": 1, "progress": False}})
        trainer = Trainer(config)
        try:
            predicted = trainer.predict()
        finally:
            trainer.close()
        assert predicted.shape == (store.num_nodes,)
        print("predict loaded", flush=True)
    except CLEAR as exc:
        print("predict refused:", type(exc).__name__, str(exc).splitlines()[0][:300], flush=True)
print("done", flush=True)
"""


@st.composite
def _tampers(draw) -> list[tuple[str, int, int]]:
    return draw(st.lists(st.tuples(st.sampled_from(FUZZ_ARRAYS), st.integers(0, 299),
                                   st.sampled_from(FUZZ_VALUES)), min_size=1, max_size=3))


@settings(max_examples=2, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(_tampers(), min_size=6, max_size=6))
def test_fuzz_tampered_arrays_with_valid_checksums_never_crash(tmp_path, clean_store, cases):
    """Every tampered store is refused by open or verify with a StoreError, and whatever
    open lets through makes the loaders and predict stop with a clear error, not a crash (all in one
    subprocess per example: a segfault fails the test instead of killing pytest)."""
    root = tmp_path / f"fuzz-{len(list(tmp_path.iterdir()))}"
    stores = []
    for i, tampers in enumerate(cases):
        store_dir = root / f"s{i}"
        shutil.copytree(clean_store, store_dir)
        for name, at, value in tampers:
            array = _array(store_dir, f"{name}.npy")
            array[at % len(array)] = np.clip(value, np.iinfo(array.dtype).min, np.iinfo(array.dtype).max)
            _tamper(store_dir, f"{name}.npy", array)
        stores.append(str(store_dir))
    run = subprocess.run([sys.executable, "-c", FUZZ_SCRIPT, *stores], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.rstrip().endswith("done"), (
        f"crashed (rc {run.returncode}) on the last store listed:\n{run.stdout[-3000:]}\n"
        f"{run.stderr[-3000:]}")
    for block in run.stdout.split("store ")[1:]:
        path, *lines = block.strip().splitlines()
        assert lines, path
        if not lines[0].startswith("open refused"):
            assert any(line.startswith("predict ") for line in lines), block
        if lines[0].startswith("verify passed"):
            # content verify accepts is valid: the loaders must then work
            assert all(line.endswith("loaded") for line in lines[1:]), block


# --- predict/embed outputs ---------------------------------------------------------------

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> tuple[Path, Path]:
    from tests.faults.test_run import _config_file, _store, _train
    root = tmp_path_factory.mktemp("trained")
    store_dir, run_dir = _store(root / "store"), root / "run"
    _train(store_dir, run_dir)
    return _config_file(store_dir, run_dir), run_dir


@pytest.mark.parametrize("command", [["predict"], ["predict", "--layerwise"], ["embed"]])
@pytest.mark.parametrize("own", ["checkpoint.pt", "metrics.jsonl", "run_config.yaml"])
def test_output_naming_a_file_of_the_run_is_refused_untouched(trained_run, capsys, command, own):
    from tests.faults.test_run import _assert_one_line_error, _cli
    config, run_dir = trained_run
    before = (run_dir / own).read_bytes()
    code, err = _cli(capsys, *command, "--config", str(config), "--out", str(run_dir / own))
    _assert_one_line_error(code, err, f"would replace the run's own {own}")
    assert (run_dir / own).read_bytes() == before


@pytest.mark.parametrize("command", [["predict"], ["embed"]])
def test_output_that_is_a_folder_is_refused_before_computing(trained_run, tmp_path, capsys, command):
    from tests.faults.test_run import _assert_one_line_error, _cli
    config, _ = trained_run
    code, err = _cli(capsys, *command, "--config", str(config), "--out", str(tmp_path))
    _assert_one_line_error(code, err, "a folder; give the path of an .npy file")
    assert list(tmp_path.iterdir()) == []


def test_failed_output_write_leaves_the_old_file_and_no_partial(tmp_path):
    out = tmp_path / "pred.npy"
    np.save(out, np.arange(5))
    with pytest.raises(OSError, match=f"{out}: cannot write"), atomic_file(out) as f:
        f.write(b"half")
        raise OSError(28, "No space left on device")
    np.testing.assert_array_equal(np.load(out), np.arange(5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.npy"]


def test_two_writers_of_one_output_get_distinct_temp_names(tmp_path):
    out = tmp_path / "emb.npy"
    with atomic_file(out) as first, atomic_file(out) as second:
        assert first.name != second.name
        first.write(b"first")
        second.write(b"second")
    assert out.read_bytes() == b"first"  # the last rename wins, each with its own data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npy"]


@pytest.mark.parametrize("run_dir", ["store", "store/runs/a"])
def test_run_dir_equal_to_or_inside_the_store_is_refused(tmp_path, run_dir):
    data = {"store": "store", "run_dir": run_dir}
    with pytest.raises(ConfigError, match=r"run_dir: store.* is (the store|inside the store) store"):
        config_from_dict(data, base_dir=tmp_path)


# --- calibration.json ----------------------------------------------------------------------

GOOD_MODEL = {"request_s": 1e-5, "read_bw": 1e9, "write_bw": 1e9, "page": 4096, "max_request": 1 << 20}


@pytest.mark.parametrize("text, message", [
    (json.dumps({"model": {**GOOD_MODEL, "read_bw": 0}}), r"model\.read_bw is 0, expected a number in"),
    (json.dumps({"model": {**GOOD_MODEL, "extra": 1}}), r"model keys \[.*'extra'.*\], expected"),
    (json.dumps({"model": {**GOOD_MODEL, "max_request": 2**40}}), r"model\.max_request is 1099511627776"),
    (json.dumps({"model": {**GOOD_MODEL, "request_s": "NaN"}}), r"model\.request_s is 'NaN'"),
    ("{not json", r"not a calibration file \(JSONDecodeError"),
])
def test_bad_calibration_json_is_refused_naming_file_and_key(tmp_path, text, message):
    from gnnssd.pipeline.calibration import load_cost_model
    (tmp_path / "calibration.json").write_text(text)
    with pytest.raises(StoreError, match=rf"calibration\.json: {message}"):
        load_cost_model(tmp_path)


def test_good_calibration_json_loads(tmp_path):
    from gnnssd.pipeline.calibration import load_cost_model
    (tmp_path / "calibration.json").write_text(json.dumps({"model": GOOD_MODEL}))
    assert load_cost_model(tmp_path).read_bw == 1e9


# --- GraphBolt metadata.yaml ---------------------------------------------------------------

def _graphbolt(root: Path) -> Path:
    from tests.datasets.test_graphbolt_igb import write_graphbolt
    write_graphbolt(root, random_graph_arrays(seed=6))
    return root


@pytest.mark.parametrize("edit, message", [
    (lambda meta: [meta], r"a YAML list at the top level, expected a mapping"),
    (lambda meta: "scalar", r"a YAML str at the top level"),
    (lambda meta: {**meta, "graph": {**meta["graph"], "nodes": "abc"}}, r"graph\.nodes and graph\.edges must be lists"),
    (lambda meta: {**meta, "graph": {**meta["graph"], "nodes": [{"num": "abc"}]}},
     r"graph\.nodes\[0\]\.num is 'abc', expected a positive integer"),
    (lambda meta: {**meta, "graph": {**meta["graph"], "nodes": [{"num": 60.7}]}},
     r"graph\.nodes\[0\]\.num is 60\.7, expected a positive integer"),
    (lambda meta: {**meta, "graph": {**meta["graph"], "edges": [{**meta["graph"]["edges"][0], "path": "../outside.npy"}]}},
     r"graph\.edges\[0\]\.path '\.\./outside\.npy' leads outside the dataset folder"),
    (lambda meta: {**meta, "graph": {**meta["graph"], "edges": [{**meta["graph"]["edges"][0], "path": "/etc/hostname"}]}},
     r"graph\.edges\[0\]\.path '/etc/hostname' leads outside"),
])
def test_graphbolt_metadata_of_the_wrong_shape_names_file_and_key(tmp_path, edit, message):
    import yaml

    from gnnssd.datasets import GraphBoltSource
    root = _graphbolt(tmp_path / "gb")
    meta = yaml.safe_load((root / "metadata.yaml").read_text())
    (root / "metadata.yaml").write_text(yaml.safe_dump(edit(meta)))
    with pytest.raises(DatasetError, match=rf"metadata\.yaml: {message}"):
        GraphBoltSource(root)


# --- OGB CSV values ------------------------------------------------------------------------

def _ogb_with(tmp_path: Path, name: str, line: int, value: str) -> Path:
    import gzip

    from tests.datasets.test_datasets import _write_ogb_layout
    root = tmp_path / "ogbn-test"
    _write_ogb_layout(root, random_graph_arrays(seed=7))
    path = root / name
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    lines[line] = value
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("name, value", [
    ("split/random/train.csv.gz", str(2**64)),
    ("raw/num-node-list.csv.gz", str(2**70)),
])
def test_ogb_csv_value_past_2_64_is_refused_naming_the_file(tmp_path, name, value):
    from gnnssd.datasets import OGBSource
    root = _ogb_with(tmp_path, name, 0, value)
    with pytest.raises(DatasetError, match=rf"{re.escape(name.split('/')[-1])}: cannot parse"):
        OGBSource(root).load_splits()


def test_ogb_edge_past_2_64_is_refused_naming_the_file(tmp_path):
    from gnnssd.datasets import OGBSource
    root = _ogb_with(tmp_path, "raw/edge.csv.gz", 3, f"{2**64},1")
    with pytest.raises(DatasetError, match=r"edge\.csv\.gz: cannot parse"):
        OGBSource(root).load_edges()


@pytest.mark.parametrize("value", ["1e30", "2.5", "-4"])
def test_ogb_label_that_is_not_a_class_is_named_with_its_line(tmp_path, value):
    from gnnssd.datasets import OGBSource
    root = _ogb_with(tmp_path, "raw/node-label.csv.gz", 4, value)
    with pytest.raises(DatasetError, match=rf"node-label\.csv\.gz: line 5 holds label {re.escape(repr(float(value)))}"):
        OGBSource(root)


def test_ogb_short_feature_row_is_named_with_its_line_not_as_nan(tmp_path):
    from gnnssd.datasets import OGBSource
    dim = random_graph_arrays(seed=7)["features"].shape[1]
    root = _ogb_with(tmp_path, "raw/node-feat.csv.gz", 9, "0.5,0.25,1.0")
    with pytest.raises(DatasetError, match=rf"node-feat\.csv\.gz: line 10 has no number in column 4 \(it "
                                           rf"has 3 of the {dim} values a feature row needs\)"):
        list(OGBSource(root).feature_chunks(0, 4))


# --- input paths of every source: resume keys and the --out overlap check -----------------

def _source_of(kind: str, root: Path):
    from gnnssd.datasets import GraphBoltSource, IGBSource, OGBBinarySource
    data = random_graph_arrays(seed=8)
    if kind == "graphbolt":
        from tests.datasets.test_graphbolt_igb import write_graphbolt
        write_graphbolt(root, data)
        return GraphBoltSource(root), root
    if kind == "igb":
        from tests.datasets.test_graphbolt_igb import write_igb
        write_igb(root, data)
        return IGBSource(root), root / "small" / "processed"
    from tests.datasets.test_ogb_binary import write_ogb_binary
    write_ogb_binary(root, data)
    return OGBBinarySource(root), root / "raw"


@pytest.mark.parametrize("kind", ["graphbolt", "igb", "ogb-binary"])
def test_out_inside_the_input_of_every_source_is_refused(tmp_path, kind):
    source, inside = _source_of(kind, tmp_path / "input")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(StoreError, match=r"overlaps the input"):
        write_store(inside / "store", source)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("kind", ["graphbolt", "igb", "ogb-binary"])
def test_every_source_lists_the_files_it_reads_for_the_resume_key(tmp_path, kind):
    from gnnssd.storage_format.preprocess.writer import _input_identity
    source, _ = _source_of(kind, tmp_path / "input")
    files = {Path(entry["path"]).name for entry in
             _input_identity([Path(p).resolve() for p in source.input_paths()])}
    expected = {"graphbolt": "metadata.yaml", "igb": "node_feat.npy", "ogb-binary": "data.npz"}[kind]
    assert expected in files, files


@pytest.mark.parametrize("dtype", [">i8", "<U3"])
def test_graphbolt_edges_npy_of_a_foreign_dtype_names_the_file(tmp_path, dtype):
    from gnnssd.datasets import GraphBoltSource
    from tests.datasets.test_graphbolt_igb import write_graphbolt
    root = tmp_path / "gb"
    write_graphbolt(root, random_graph_arrays(seed=9))
    edges = next(root.rglob("edges*.npy")) if list(root.rglob("edges*.npy")) else None
    assert edges is not None, sorted(map(str, root.rglob("*")))
    np.save(edges, np.load(edges).astype(dtype))
    with pytest.raises(DatasetError, match=rf"{re.escape(edges.name)}: dtype {re.escape(np.dtype(dtype).str)} "
                                           r"\(edges\), expected little-endian numbers"):
        GraphBoltSource(root)


# --- report on bad metrics lines -----------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("epoch", "1e400", r"'epoch' is inf, expected an integer"),
    ("epoch", '"x"', r"'epoch' is 'x', expected an integer"),
    ("train_loss", '"abc"', r"'train_loss' is 'abc', expected a number"),
])
def test_report_on_a_bad_metrics_value_names_file_line_and_key(tmp_path, field, value, message):
    from gnnssd.cli.report import read_metrics
    good = {"epoch": 1, "train_loss": 0.5, "epoch_s": 1.0, "stages_s": {}}
    bad = json.dumps({**good, "epoch": 2, field: "PLACEHOLDER"}).replace('"PLACEHOLDER"', value)
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(good) + "\n" + bad + "\n")
    with pytest.raises(RuntimeError, match=rf"metrics\.jsonl, line 2: {message}"):
        read_metrics(path)


# --- --nproc --------------------------------------------------------------------------------

def test_nproc_past_the_upper_bound_is_refused_before_launching():
    from gnnssd.training.distributed import MAX_LOCAL_RANKS, launch
    with pytest.raises(ConfigError, match=rf"--nproc {MAX_LOCAL_RANKS + 1}: expected 1\.\.{MAX_LOCAL_RANKS}"):
        launch(MAX_LOCAL_RANKS + 1, os.getpid)
