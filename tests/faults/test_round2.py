"""Fault cases of issue 24 (reliability, round 2): input files that must not run code or
exhaust memory, stores whose checksums are valid but whose content is not, and run
directories a hostile user prepared. Each test is named after its fault."""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from gnnssd.datasets import PlanetoidSource
from gnnssd.storage_format import DatasetError


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
