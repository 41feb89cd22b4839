"""Verified stamps (storage_format.verified): a store opened again is not hashed again while
its files are as the passing check found them, and is the moment anything changes; the
stamps live in the cache folder (the session's: tests/conftest.py), which may be unusable."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import gnnssd.storage_format.store as store_module
from gnnssd.datasets import ArraySource
from gnnssd.storage_format import Store, StoreError, write_store
from gnnssd.storage_format import verified
from gnnssd.storage_format.manifest import FEATURES

from tests.conftest import random_graph_arrays


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files Store hashes (the real CRC-32, recorded)."""
    names: list[str] = []
    real = store_module.crc32_of_file

    def recording(path: Path, *args: int) -> int:
        names.append(Path(path).name)
        return real(path, *args)

    monkeypatch.setattr(store_module, "crc32_of_file", recording)
    return names


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own cache folder; files count as settled at once (no racy window), which
    test_a_file_changed_moments_ago_is_not_stamped checks on its own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(verified.CACHE_ENV, str(folder))
    monkeypatch.setattr(verified, "RACY_NS", 0)
    return folder


def _store(path: Path) -> Path:
    return write_store(path, ArraySource(**random_graph_arrays()))


def _hashed_files(path: Path) -> list[str]:
    """What a full check hashes: every file of the manifest but features.bin (its pages)."""
    return sorted(name for name in Store(path, json.loads((path / "manifest.json").read_text()))
                  .manifest["files"] if name != FEATURES)


def test_a_second_open_hashes_nothing(tmp_path: Path, cache: Path, hashed: list[str]) -> None:
    path = _store(tmp_path / "s")
    first = Store.open(path)
    assert sorted(hashed) == _hashed_files(path)
    assert verified.stamp_path(path).is_file() and verified.stamp_path(path).is_relative_to(cache)
    hashed.clear()
    second = Store.open(path)
    assert hashed == []
    assert second.summary() == first.summary()
    np.testing.assert_array_equal(second.indices, first.indices)


def test_verify_hashes_everything_again(tmp_path: Path, cache: Path, hashed: list[str]) -> None:
    path = _store(tmp_path / "s")
    Store.open(path)
    hashed.clear()
    Store.open(path, verify=True)
    assert sorted(hashed) == _hashed_files(path)
    hashed.clear()
    Store.open(path).verify()
    assert sorted(hashed) == _hashed_files(path)


@pytest.mark.parametrize("restore_mtime", [False, True], ids=["mtime-changed", "mtime-set-back"])
def test_a_file_changed_in_place_is_caught(tmp_path: Path, cache: Path, hashed: list[str],
                                           restore_mtime: bool) -> None:
    """Same size, one byte of content changed, in place (same inode); its mtime changed, or
    set back as it was (ctime, which only the kernel sets, still changes)."""
    path = _store(tmp_path / "s")
    Store.open(path)
    hashed.clear()
    Store.open(path)
    assert hashed == []
    file = path / "indices.npy"
    before = os.stat(file)
    with open(file, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    if restore_mtime:
        os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(file)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    hashed.clear()
    with pytest.raises(StoreError, match="indices.npy: checksum mismatch"):
        Store.open(path)
    assert "indices.npy" in hashed


def test_a_stamp_of_another_store_is_not_trusted(tmp_path: Path, cache: Path, hashed: list[str]) -> None:
    """A copy of a store (the same bytes and manifest, other inodes) with the original's
    stamp, made to name the copy, is hashed in full; the original is not."""
    original = _store(tmp_path / "a")
    Store.open(original)
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    stamp = json.loads(verified.stamp_path(original).read_text())
    stamp["store"] = str(copy.resolve())
    verified.stamp_path(copy).write_text(json.dumps(stamp))
    hashed.clear()
    Store.open(copy)
    assert sorted(hashed) == _hashed_files(copy)
    hashed.clear()
    Store.open(original)
    assert hashed == []


def test_a_store_replaced_at_its_path_is_hashed(tmp_path: Path, cache: Path, hashed: list[str]) -> None:
    """Preprocessed again into the same folder: new files and manifest, the old stamp unused."""
    path = _store(tmp_path / "s")
    Store.open(path)
    hashed.clear()
    Store.open(path)
    assert hashed == []
    shutil.rmtree(path)
    _store(path)
    hashed.clear()
    Store.open(path)
    assert sorted(hashed) == _hashed_files(path)


@pytest.mark.parametrize("stamp", [b"{not json", b"\xff\xfe", b"[]", b'{"format": "gnnssd-verified"}',
                                   b"x" * (verified.STAMP_BYTES + 1), "wrong types", "a symlink", "a directory",
                                   "writable by others"])
def test_a_corrupt_or_hostile_stamp_counts_as_absent(tmp_path: Path, cache: Path, hashed: list[str],
                                                      stamp: bytes | str) -> None:
    path = _store(tmp_path / "s")
    Store.open(path)
    target = verified.stamp_path(path)
    good = json.loads(target.read_text())
    target.unlink()
    if stamp == "wrong types":
        good["files"] = {name: [str(v) for v in entry] for name, entry in good["files"].items()}
        target.write_text(json.dumps(good))
    elif stamp == "a symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps(good))
        target.symlink_to(tmp_path / "elsewhere.json")
    elif stamp == "a directory":
        target.mkdir()
    elif stamp == "writable by others":
        target.write_text(json.dumps(good))
        target.chmod(0o666)
    else:
        target.write_bytes(stamp)
    hashed.clear()
    store = Store.open(path)
    assert sorted(hashed) == _hashed_files(path)
    assert store.num_nodes == 300


def test_an_unusable_cache_folder_still_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              hashed: list[str]) -> None:
    """A cache path under a regular file cannot be made (even by root): every open hashes,
    none fails."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(verified.CACHE_ENV, str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(verified, "RACY_NS", 0)
    path = _store(tmp_path / "s")
    for _ in range(2):
        hashed.clear()
        assert Store.open(path).num_nodes == 300
        assert sorted(hashed) == _hashed_files(path)


def test_a_cache_folder_writable_by_others_is_not_used(tmp_path: Path, cache: Path, hashed: list[str]) -> None:
    path = _store(tmp_path / "s")
    (cache / "verified").mkdir(parents=True)
    (cache / "verified").chmod(0o777)
    for _ in range(2):
        hashed.clear()
        Store.open(path)
        assert sorted(hashed) == _hashed_files(path)
    assert list((cache / "verified").iterdir()) == []


def test_a_file_changed_moments_ago_is_not_stamped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   hashed: list[str]) -> None:
    """Within RACY_NS of its last change a file could change again keeping its times: a
    store just written is hashed on its second open too."""
    monkeypatch.setenv(verified.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(verified, "RACY_NS", 3600 * 10**9)
    path = _store(tmp_path / "s")
    Store.open(path)
    hashed.clear()
    Store.open(path)
    assert sorted(hashed) == _hashed_files(path)


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(verified.CACHE_ENV, str(tmp_path / "own"))
    assert verified.cache_dir() == tmp_path / "own"
    monkeypatch.delenv(verified.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert verified.cache_dir() == tmp_path / "xdg" / "gnnssd"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG spec: a relative path is ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert verified.cache_dir() == tmp_path / "home" / ".cache" / "gnnssd"
