"""Fault cases of the store and the I/O engine (issue 10): what preprocess refuses, what it
cleans up, and corrupt data that reading must stop at. Each test is named after its fault."""
from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gnnssd.core.config import config_from_dict
from gnnssd.datasets import HeterophilousSource, PlanetoidSource, synthetic_source
from gnnssd.datasets.arrays import ArraySource
from gnnssd.io_engine import ChecksumError, Engine
from gnnssd.io_engine.crc import (PAGE_CRC_PATHS, checksum_error, crc32c, first_bad_page as c_first_bad_page,
                                  page_crc32c, page_crc_path)
from gnnssd.pipeline import DirectIO
from gnnssd.sampler.readplan import CostModel, per_row_requests, plan_extents
from gnnssd.storage_format import DatasetError, PageChecksumError, Store, StoreError, page_crc, write_store
from gnnssd.training.tasks import Trainer
from tests.conftest import REPO, random_graph_arrays

BACKENDS = ["io_uring", "threads"]


def _write_npz(path: Path, seed: int, num_nodes: int = 200, dim: int = 8) -> Path:
    """A small graph in the heterophilous-benchmark .npz layout."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((10, num_nodes), dtype=bool)
    masks[:, :100] = True
    val, test = np.zeros_like(masks), np.zeros_like(masks)
    val[:, 100:150] = True
    test[:, 150:] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, node_features=rng.standard_normal((num_nodes, dim)).astype(np.float32),
             node_labels=rng.integers(3, size=num_nodes), edges=rng.integers(num_nodes, size=(600, 2)),
             train_masks=masks, val_masks=val, test_masks=test)
    return path


def _small_store(path: Path, seed: int = 0) -> Path:
    return write_store(path, ArraySource(**random_graph_arrays(seed=seed)))


def _store_files(path: Path) -> dict[str, bytes]:
    """Every file of a store but the manifest (which records when it was made)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "manifest.json"}


# --- preprocess --out -------------------------------------------------------------------

def test_out_naming_a_foreign_folder_is_refused_untouched(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(StoreError, match=r"photos: an existing folder that is not a gnnssd store"):
        _small_store(folder)
    assert [p.name for p in folder.iterdir()] == ["holiday.jpg"]
    assert (folder / "holiday.jpg").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]


@pytest.mark.parametrize("where", ["the input file", "the folder holding the input file"])
def test_out_overlapping_the_input_file_is_refused(tmp_path, where):
    graph = _write_npz(tmp_path / "raw" / "graph.npz", seed=0)
    out = graph if where == "the input file" else graph.parent
    with pytest.raises(StoreError, match=r"overlaps the input .*graph.npz"):
        write_store(out, HeterophilousSource(graph))
    assert sorted(p.name for p in graph.parent.iterdir()) == ["graph.npz"]


@pytest.mark.parametrize("where", ["the input root", "inside the input root"])
def test_out_overlapping_the_input_root_is_refused(tmp_path, planetoid_root, where):
    root = tmp_path / "planetoid"
    root.mkdir()
    for part in planetoid_root.glob("ind.cora.*"):
        shutil.copy(part, root / part.name)
    before = sorted(p.name for p in root.iterdir())
    out = root if where == "the input root" else root / "store"
    with pytest.raises(StoreError, match=r"overlaps the input .*planetoid"):
        write_store(out, PlanetoidSource(root, "cora"))
    assert sorted(p.name for p in root.iterdir()) == before


def test_out_naming_a_regular_file_is_refused_not_moved(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    with pytest.raises(StoreError, match=r"notes.txt: exists and is not a directory"):
        _small_store(target)
    assert target.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("store_exists", [False, True])
@pytest.mark.parametrize("suffix", ["partial", "old"])
def test_user_folder_named_like_preprocess_scratch_is_refused_untouched(tmp_path, suffix, store_exists):
    """A folder `.NAME.partial` / `.NAME.old` beside --out that preprocess did not make
    (no marker file of gnnssd's) is neither deleted, moved nor written into."""
    if store_exists:
        _small_store(tmp_path / "store")
    folder = tmp_path / f".store.{suffix}"
    folder.mkdir()
    (folder / "thesis.tex").write_text("precious")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(StoreError, match=rf"\.store\.{suffix}: not made by gnnssd preprocess \(no "
                                         r"\S+ naming --out store\); refusing to delete or reuse it"):
        _small_store(tmp_path / "store", seed=1)
    assert [p.name for p in folder.iterdir()] == ["thesis.tex"]
    assert (folder / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if store_exists:
        Store.open(tmp_path / "store", verify=True)


def test_swap_interrupted_between_its_renames_is_restored(tmp_path, monkeypatch):
    """A crash after the old store moved to `.NAME.old` and before the new one moved in:
    the next preprocess puts the old store back, then resumes and replaces it."""
    from gnnssd.storage_format.preprocess import partial_dir

    out = _small_store(tmp_path / "store")
    renames, rename = [], os.rename

    def crash_on_the_second_rename(src, dst):
        renames.append(dst)
        if len(renames) == 2:
            raise Interrupted
        rename(src, dst)

    monkeypatch.setattr(partial_dir.os, "rename", crash_on_the_second_rename)
    with pytest.raises(Interrupted):
        write_store(out, ArraySource(**random_graph_arrays(seed=1)))
    monkeypatch.undo()
    assert not out.exists() and (tmp_path / ".store.old").is_dir()
    write_store(out, ArraySource(**random_graph_arrays(seed=1)))
    np.testing.assert_array_equal(Store.open(out, verify=True).features_memmap(),
                                  random_graph_arrays(seed=1)["features"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_out_naming_an_empty_folder_or_a_store_is_written(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    Store.open(_small_store(empty), verify=True)
    second = write_store(empty, ArraySource(**random_graph_arrays(seed=1)))  # replaces the store
    np.testing.assert_array_equal(Store.open(second).features_memmap(),
                                  random_graph_arrays(seed=1)["features"])


# --- page checksums: C CRC32C, engine, loaders --------------------------------------------

def _crc32c_reference(data: bytes) -> int:
    """Bitwise CRC32C (reflected polynomial 0x82F63B78), independent of the C code."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("hardware", [True, False])
def test_c_crc32c_equals_a_reference(hardware):
    assert crc32c(b"123456789", hardware=hardware) == 0xE3069283  # the standard check value
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 8, 9, 63, 4096, 5000):
        data = rng.integers(256, size=size, dtype=np.uint8).tobytes()
        assert crc32c(data, hardware=hardware) == _crc32c_reference(data), size
    data = rng.integers(256, size=3 * 4096 + 100, dtype=np.uint8).tobytes()
    pages = [data[k:k + 4096] for k in range(0, len(data), 4096)]
    assert page_crc32c(data).tolist() == [_crc32c_reference(p) for p in pages]
    assert crc32c(data[10:], crc32c(data[:10], hardware=hardware), hardware) == crc32c(data)


@pytest.mark.parametrize("path", list(PAGE_CRC_PATHS))
def test_every_page_checksum_path_equals_the_table(path):
    """Each of the engine's page checksum paths (a CPU without one runs the next slower one
    it has) gives the table's checksums: whole 4 KiB pages, a short last page, a start
    that is not aligned, pages of all zeros and all ones, other page sizes, the check value."""
    rng = np.random.default_rng(3)
    data = rng.integers(256, size=37 * 4096 + 100, dtype=np.uint8)
    cases = [(data, 4096), (data[1:], 4096), (data[:5 * 4096], 4096), (data, 4099), (data[:100], 9),
             (np.zeros(8 * 4096, np.uint8), 4096), (np.full(8 * 4096, 255, np.uint8), 4096)]
    for view, page in cases:
        np.testing.assert_array_equal(page_crc32c(view, page, path), page_crc32c(view, page, "table"))
    assert page_crc32c(data[:4096], path=path).tolist() == [_crc32c_reference(data[:4096].tobytes())]
    assert page_crc32c(b"123456789", 9, path).tolist() == [0xE3069283]


def test_the_fastest_page_checksum_path_this_cpu_has_is_taken():
    flags = set()
    if Path("/proc/cpuinfo").exists():
        flags = {f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
                 for f in line.split(":", 1)[1].split()}
    if not flags:
        pytest.skip("no /proc/cpuinfo flags to compare with")
    expected = ("vpclmulqdq" if {"avx512f", "vpclmulqdq", "pclmulqdq", "sse4_2"} <= flags
                else "sse4.2" if "sse4_2" in flags else "table")
    assert page_crc_path() == expected


@pytest.mark.parametrize("asked", ["table", "sse4.2", "vpclmulqdq", "crc64"])
def test_a_slower_page_checksum_path_is_taken_when_named(asked):
    """GNNSSD_PAGE_CRC names a path for the whole process (to compare them): a slower one
    is taken, a faster one than the CPU has is not, an unknown name is refused naming it."""
    probe = "from gnnssd.io_engine.crc import PAGE_CRC_PATHS, page_crc_path; print(page_crc_path())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env={**os.environ, "GNNSSD_PAGE_CRC": asked})
    if asked == "crc64":
        assert result.returncode != 0 and "GNNSSD_PAGE_CRC='crc64': expected one of table, sse4.2" in result.stderr
        return
    order = list(PAGE_CRC_PATHS)
    assert result.stdout.strip() == order[min(order.index(asked), order.index(page_crc_path()))]


def test_numba_crc32c_equals_the_c_engine():
    """The store's own (numba) CRC32C gives the engine's C checksums: the check value,
    random data of odd lengths, odd page sizes, and the bitwise reference."""
    assert page_crc.page_crc32c(b"123456789", page=9).tolist() == [0xE3069283]
    rng = np.random.default_rng(1)
    for size in (0, 1, 7, 8, 9, 15, 63, 4095, 4097, 3 * 4096 + 101, 99_999):
        data = rng.integers(256, size=size, dtype=np.uint8).tobytes()
        whole = page_crc.page_crc32c(data, page=max(size, 1))
        assert whole.tolist() == ([crc32c(data)] if size else []), size
        for page in (1, 5, 8, 4096, 4099):
            np.testing.assert_array_equal(page_crc.page_crc32c(data, page), page_crc32c(data, page))
        if size < 5000:
            assert whole.tolist() == ([_crc32c_reference(data)] if size else []), size
    assert page_crc.page_crc32c(np.arange(4096 * 3, dtype=np.uint8)).dtype == np.uint32


def test_numba_first_bad_page_equals_the_c_engine():
    """The first mismatching page (and its CRC32C) at file offsets, with checksums that end
    before the data (those pages are not checked), and None when all pages match."""
    rng = np.random.default_rng(2)
    data = rng.integers(256, size=20 * 4096 + 123, dtype=np.uint8)
    sums = page_crc32c(data)
    assert page_crc.first_bad_page(data, 0, sums) is None
    for bad in (0, 7, 19, 20):
        damaged = data.copy()
        damaged[bad * 4096 + 5] ^= 1
        for lo in (0, 4096 * min(bad, 3)):
            chunk, covered = damaged[lo:], sums[:bad + 1]
            expected = (bad, int(page_crc32c(damaged[bad * 4096:(bad + 1) * 4096])[0]))
            assert page_crc.first_bad_page(chunk, lo, sums) == expected
            assert c_first_bad_page(chunk, lo, sums) == expected
            assert page_crc.first_bad_page(chunk, lo, covered[:bad]) is None  # not covered
    with pytest.raises(ValueError, match="offset 100"):
        page_crc.first_bad_page(data, 100, sums)


def test_store_and_engine_checksum_errors_share_one_wording():
    store_error = page_crc.page_checksum_error("s/features.bin", 3, 0x1234, 0xABCDEF01)
    engine_error = checksum_error("s/features.bin", 3, 0x1234, 0xABCDEF01)
    assert isinstance(store_error, StoreError) and isinstance(engine_error, OSError)
    assert str(store_error) == engine_error.strerror
    assert str(store_error).startswith("s/features.bin: page 3 (bytes 12288..16383) has CRC32C "
                                       "0x00001234, its checksum file says 0xabcdef01")


def test_store_page_checksums_cover_features_bin(tmp_path):
    store = Store.open(_small_store(tmp_path / "s"))
    data = store.features_path.read_bytes()
    sums = store.page_checksums()
    assert len(sums) == len(data) // 4096 and len(data) % 4096 == 0
    assert sums.tolist() == [_crc32c_reference(data[k:k + 4096]) for k in range(0, len(data), 4096)]


def _corrupt(store: Store, row: int, how: str) -> int:
    """Damage row `row` of features.bin (a flipped byte or a NaN row); returns its page."""
    offset = row * store.row_bytes
    with open(store.features_path, "r+b") as f:
        f.seek(offset)
        if how == "flipped byte":
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ 0x10]))
        else:
            f.write(np.full(store.feat_dim, np.nan, store.feat_dtype).tobytes())
    return offset // 4096


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["flipped byte", "NaN row"])
def test_corrupt_page_fails_engine_reads(tmp_path, backend, how):
    """Row reads and extent reads both stop at the damaged page, on both backends; a read
    of the file opened without checksums still returns the damaged bytes."""
    source = synthetic_source(num_nodes=2000, feat_dim=32, num_classes=4, avg_degree=4)
    store = Store.open(write_store(tmp_path / "s", source))
    page = _corrupt(store, 1000, how)
    with Engine(backend=backend, queue_depth=16) as engine:
        with engine.open(store.features_path, checksums=store.page_checksums()) as f:
            with pytest.raises(ChecksumError) as err:
                engine.read_rows(f, np.arange(store.num_nodes), store.row_bytes,
                                 *plan_extents(np.arange(store.num_nodes), store.row_bytes, CostModel.default())[:2])
            first = np.arange(10)  # untouched pages read
            clean = engine.read_rows(f, first, store.row_bytes, *per_row_requests(first, store.row_bytes))
        with engine.open(store.features_path) as f:
            raw = engine.read_rows(f, [1000], store.row_bytes, *per_row_requests(np.array([1000]), store.row_bytes))
    message = str(err.value)
    expected = int(store.page_checksums()[page])
    got = _crc32c_reference(store.features_path.read_bytes()[page * 4096:(page + 1) * 4096])
    assert f"page {page} " in message and str(store.features_path) in message
    assert f"{got:#010x}" in message and f"{expected:#010x}" in message and "gnnssd verify" in message
    np.testing.assert_array_equal(clean, store.features_memmap()[:10].view(np.uint8).reshape(10, -1))
    assert raw.tobytes() == store.features_memmap()[1000].tobytes()

    io = DirectIO(queue_depth=8, backend=backend, checksums={store.features_path: store.page_checksums()})
    try:  # the planner's adapter (mega-batch loader, repack scans): whole-file extents
        f = io.open(store.features_path)
        buf = io.alloc(f.size)
        with pytest.raises(PageChecksumError, match=f"page {page} ") as store_err:  # a StoreError and an OSError
            io.read_extents(f, [0], [f.size], buf, [0])
        assert str(store_err.value) == message and isinstance(store_err.value, OSError)
        io.close(f)
    finally:
        io.shutdown()


def _train_config(store: Path, run_dir: Path, features: str, **ssd):
    return config_from_dict({
        "store": str(store), "run_dir": str(run_dir), "features": features, "seed": 1,
        "model": {"name": "sage", "hidden": 16},
        "sampler": {"fanouts": [4, 4], "batch_size": 100, "eval_fanouts": [4, 4], "eval_batch_size": 200},
        "train": {"epochs": 1, "lr": 0.01, "progress": False},
        "ssd": {"memory_budget": "16MiB", "mega_batch": 2, "hot_fraction": 0.2, **ssd}})


@pytest.mark.parametrize("features", ["memory", "ssd"])
@pytest.mark.parametrize("how", ["flipped byte", "NaN row"])
def test_corrupt_features_stop_training(tmp_path, features, how):
    source = synthetic_source(num_nodes=3000, feat_dim=32, num_classes=4, avg_degree=5,
                              train_fraction=0.3)
    path = write_store(tmp_path / "s", source)
    store = Store.open(path)
    page = _corrupt(store, int(store.train_idx[0]), how)
    # one error whichever path read the page (the store's own check in memory mode, the I/O
    # engine's in ssd mode): a caller catching StoreError misses neither
    with pytest.raises(PageChecksumError, match=rf"features.bin: page {page} .*gnnssd verify"):
        trainer = Trainer(_train_config(path, tmp_path / "run", features))
        try:
            trainer.fit()
        finally:
            trainer.close()
    with pytest.raises(PageChecksumError, match=f"page {page} "):
        Store.open(path).verify()


def test_checksums_off_reads_without_verifying(tmp_path):
    """ssd.verify_checksums: false: the loader's engine opens features.bin without them."""
    path = write_store(tmp_path / "s", synthetic_source(num_nodes=3000, feat_dim=32,
                                                        num_classes=4, avg_degree=5))
    trainer = Trainer(_train_config(path, tmp_path / "run", "ssd", verify_checksums=False))
    try:
        assert trainer.loader.backend.features.file.checksums is None
    finally:
        trainer.close()
    trainer = Trainer(_train_config(path, tmp_path / "run2", "ssd"))
    try:
        np.testing.assert_array_equal(trainer.loader.backend.features.file.checksums,
                                      Store.open(path).page_checksums())
    finally:
        trainer.close()


# --- the manifest -------------------------------------------------------------------------

def _edit_manifest(path: Path, edit) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("key, value, message", [
    ("dtype", "float16", r"features.dim 8 x features.dtype float16 \(2 B\) = 16 B per row, but "
                         r"features.row_bytes is 32"),
    ("dim", 16, r"features.dim 16 x features.dtype float32 \(4 B\) = 64 B per row, but "
                r"features.row_bytes is 32"),
    ("dim", 0, r"features.dim 0, expected a positive integer"),
    ("dtype", "int16", r"features.dtype 'int16', expected one of"),
    ("num_classes", 2, r"num_classes 2, but labels.npy holds label 3"),
    ("num_nodes", 500, r"files.features.bin.size is 12288, but num_nodes 500 x row_bytes 32 "
                       r"\(padded to 4096\) needs 16384"),
    ("num_edges", 5, r"indices.npy holds \d+ entries, but num_edges 5"),
    ("name", "edited", r"checksum \d+ does not match its content"),
])
def test_edited_manifest_key_is_refused(tmp_path, key, value, message):
    path = _small_store(tmp_path / "s")

    def edit(manifest):
        (manifest["features"] if key in ("dtype", "dim") else manifest)[key] = value

    _edit_manifest(path, edit)
    with pytest.raises(StoreError, match=message):
        Store.open(path)


def test_store_of_an_older_format_says_rerun_preprocess(tmp_path):
    path = _small_store(tmp_path / "s")
    _edit_manifest(path, lambda m: m.update(format_version=1))
    with pytest.raises(StoreError, match=r"format_version 1, .* rerun `gnnssd preprocess`"):
        Store.open(path)


# --- resume, lock ---------------------------------------------------------------------------

class Interrupted(Exception):
    pass


def _stop_after_features(stage: str, done: int, total: int) -> None:
    if stage == "features" and done > 0:
        raise Interrupted


def test_resume_with_another_input_of_the_same_name_starts_afresh(tmp_path):
    a = _write_npz(tmp_path / "a" / "graph.npz", seed=1)
    b = _write_npz(tmp_path / "b" / "graph.npz", seed=2)
    with pytest.raises(Interrupted):
        write_store(tmp_path / "out", HeterophilousSource(a), progress=_stop_after_features)
    assert (tmp_path / ".out.partial").is_dir()
    write_store(tmp_path / "out", HeterophilousSource(b))
    write_store(tmp_path / "clean", HeterophilousSource(b))
    assert _store_files(tmp_path / "out") == _store_files(tmp_path / "clean")
    Store.open(tmp_path / "out", verify=True)


def test_resume_of_the_same_input_continues(tmp_path):
    """The identity key still lets an unchanged input resume (the features are kept)."""
    a = _write_npz(tmp_path / "a" / "graph.npz", seed=1)
    with pytest.raises(Interrupted):
        write_store(tmp_path / "out", HeterophilousSource(a), progress=_stop_after_features)
    staged = (tmp_path / ".out.partial" / "features.bin").stat().st_ino
    seen = []
    write_store(tmp_path / "out", HeterophilousSource(a), progress=lambda s, d, t: seen.append(s))
    assert "features" not in seen  # nothing rewritten
    assert (tmp_path / "out" / "features.bin").stat().st_ino == staged


def test_concurrent_preprocess_to_one_out_fails_fast(tmp_path):
    """This process holds the destination (its preprocess paused in a progress callback);
    a `gnnssd preprocess` process to the same --out fails at once naming it and our pid,
    and the first preprocess then finishes untouched."""
    out = tmp_path / "store"
    paused, release = threading.Event(), threading.Event()

    def pause(stage: str, done: int, total: int) -> None:
        if stage == "features" and not paused.is_set():
            paused.set()
            release.wait(timeout=300)

    data = random_graph_arrays()
    first = threading.Thread(target=write_store, args=(out, ArraySource(**data)),
                             kwargs={"progress": pause})
    first.start()
    try:
        assert paused.wait(timeout=60)
        second = subprocess.run([sys.executable, "-m", "gnnssd", "preprocess", "synthetic",
                                 "--nodes", "1000", "--out", str(out)], cwd=REPO,
                                capture_output=True, text=True, timeout=300)
    finally:
        release.set()
        first.join()
    assert second.returncode == 2
    assert f"another gnnssd preprocess (pid {os.getpid()}) is writing this store" in second.stderr
    assert f"--out {out}:" in second.stderr and "Traceback" not in second.stderr
    np.testing.assert_array_equal(Store.open(out, verify=True).features_memmap(), data["features"])


# --- inputs preprocess accepts but training cannot use ---------------------------------------

def test_feature_dim_zero_is_refused(tmp_path):
    data = random_graph_arrays()
    data["features"] = np.empty((300, 0), np.float32)
    with pytest.raises(DatasetError, match="feature dim 0; every node needs at least one feature"):
        write_store(tmp_path / "s", ArraySource(**data))
    assert not any(tmp_path.iterdir())


def test_label_of_a_billion_is_refused(tmp_path):
    data = random_graph_arrays()
    data["labels"][7] = 10**9
    with pytest.raises(DatasetError, match=r"label 1000000000 of node 7 makes 1,000,000,001 "
                                           r"classes, more than the 300 labelled nodes"):
        write_store(tmp_path / "s", ArraySource(**data))


# --- disk full -------------------------------------------------------------------------------

@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MiB tmpfs mounted for the test (needs root; skipped otherwise)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_not_enough_disk_is_refused_before_writing(tmp_path, small_filesystem):
    graph = _write_npz(tmp_path / "raw" / "graph.npz", seed=0, num_nodes=2000, dim=256)
    out = small_filesystem / "store"
    done = subprocess.run([sys.executable, "-m", "gnnssd", "preprocess", "npz", "--file", str(graph),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert f"--out {out}: not enough free disk" in done.stderr
    needed = re.search(r"preprocess needs about ([\d.]+) MiB free there \(([\d.]+) MiB free now\) on "
                       rf"the filesystem of {re.escape(str(small_filesystem))}", done.stderr)
    assert needed and float(needed[1]) >= 2000 * 1024 / 2**20 > 1 >= float(needed[2])
    assert "Traceback" not in done.stderr
    assert list(small_filesystem.iterdir()) == []


def test_disk_full_names_the_file_removes_the_partial_and_says_the_space(tmp_path, small_filesystem,
                                                                       monkeypatch):
    """The disk fills up anyway (another writer, a wrong estimate): the error names the
    file, the unfinished store goes, the message says the space needed."""
    from gnnssd.datasets import HeterophilousSource
    from gnnssd.storage_format.preprocess import writer

    graph = _write_npz(tmp_path / "raw" / "graph.npz", seed=0, num_nodes=2000, dim=256)
    out = small_filesystem / "store"
    monkeypatch.setattr(writer, "_check_free_space", lambda *args: None)
    with pytest.raises(writer.DiskFullError) as error:
        writer.write_store(out, HeterophilousSource(graph))
    message = str(error.value)
    del error  # its traceback holds the frames (and open files) of the failed write
    gc.collect()
    assert (f"no space left on the device while writing feature rows to "
            f"{small_filesystem / '.store.partial' / 'features.bin'}") in message
    assert "removed the unfinished store" in message
    needed = re.search(r"preprocess needs about ([\d.]+) MiB free there \(([\d.]+) MiB free now\)", message)
    assert needed and float(needed[1]) >= 2000 * 1024 / 2**20 > 1 >= float(needed[2])
    assert list(small_filesystem.iterdir()) == []


# --- the io_uring driver ----------------------------------------------------------------------

def _io_uring_fds() -> list[int]:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "io_uring" in os.readlink(f"/proc/self/fd/{name}"):
                fds.append(int(name))
        except OSError:  # the listing's own fd, gone already
            pass
    return fds


def test_broken_ring_fails_reads_without_hanging(tmp_path):
    """The ring's fd replaced under the driver (io_uring_enter then fails for the ring
    itself): the reads in hand, and every later one, fail with an OSError naming the
    file, and close() returns. (Whether the kernel still held reads when the ring broke,
    which the driver then waits for, cannot be arranged from a test.)"""
    path = tmp_path / "data.bin"
    path.write_bytes(np.random.default_rng(0).integers(256, size=64 * 4096, dtype=np.uint8).tobytes())
    before = set(_io_uring_fds())
    engine = Engine(backend="io_uring", queue_depth=8)
    try:
        f = engine.open(path)
        buf = engine.alloc(64 * 4096)
        pages = np.arange(64) * 4096
        engine.read_extents(f, pages, [4096] * 64, buf, pages)
        assert buf.tobytes() == path.read_bytes()
        ring = set(_io_uring_fds()) - before
        assert len(ring) == 1
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, ring.pop())
        os.close(null)
        for _ in range(2):
            with pytest.raises(OSError, match=f"read of {path} at offset"):
                engine.read_extents(f, pages, [4096] * 64, buf, pages)
        f.close()
    finally:
        engine.close()


def test_layerwise_inference_stops_on_a_corrupt_page(tmp_path):
    """Layer-wise inference reads features.bin through the engine with its page checksums."""
    from gnnssd.core.config import ModelConfig
    from gnnssd.inference.layerwise import LayerwiseSSD
    from gnnssd.models.builtin import build_model

    path = write_store(tmp_path / "s", synthetic_source(num_nodes=3000, feat_dim=32,
                                                        num_classes=4, avg_degree=5))
    store = Store.open(path)
    page = store.feature_bytes // 2 // 4096
    with open(store.features_path, "r+b") as f:
        f.seek(page * 4096 + 100)
        byte = f.read(1)
        f.seek(page * 4096 + 100)
        f.write(bytes([byte[0] ^ 0x10]))
    model = build_model(ModelConfig(name="sage", hidden=8, layers=2), store.feat_dim, 4)
    runner = LayerwiseSSD(store, tmp_path / "scratch", budget=1 << 20)
    try:
        with pytest.raises(PageChecksumError, match=rf"features.bin: page {page} .*gnnssd verify"):
            runner.run(model)
    finally:
        runner.close()
