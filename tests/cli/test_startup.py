"""The CLI starts at once: `gnnssd --help`, `info` and `verify`, through either entry point
(the `gnnssd` script's gnnssd.cli:main and `python -m gnnssd`), run in a fresh interpreter
without importing torch or DGL; --help and info of a store opened before (its verified
stamps: storage_format.verified) without numba either. verify loads numba: it is the page
CRC32C and the content checks' kernel."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gnnssd.datasets import ArraySource
from gnnssd.storage_format import Store, write_store
from gnnssd.storage_format.verified import RACY_NS

from tests.conftest import random_graph_arrays

HEAVY = ("torch", "dgl", "numba")
PROBE = """
import json, runpy, sys
entry, *args = sys.argv[1:]
sys.argv = ["gnnssd", *args]
try:
    if entry == "module":
        runpy.run_module("gnnssd", run_name="__main__", alter_sys=True)
    else:
        from gnnssd.cli import main
        sys.exit(main(args))
except SystemExit as done:
    code = done.code
print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules} & set(%r))]))
""" % (HEAVY,)


@pytest.fixture(scope="module")
def stamped_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose files are settled (older than the racy window) and opened once, so
    its stamps are in the session's cache folder, which the probes inherit."""
    path = write_store(tmp_path_factory.mktemp("startup") / "store", ArraySource(**random_graph_arrays()))
    time.sleep(RACY_NS / 1e9)
    Store.open(path)
    return path


def _heavy_modules(entry: str, *args: str) -> list[str]:
    """Which of HEAVY the command imported (it must exit 0)."""
    out = subprocess.run([sys.executable, "-c", PROBE, entry, *args], capture_output=True, text=True, timeout=300)
    code, modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert code in (0, None), out.stderr
    return modules


@pytest.mark.parametrize("entry", ["script", "module"])
def test_help_and_info_import_neither_torch_dgl_nor_numba(entry: str, stamped_store: Path) -> None:
    assert _heavy_modules(entry, "--help") == []
    assert _heavy_modules(entry, "info", str(stamped_store)) == []


@pytest.mark.parametrize("entry", ["script", "module"])
def test_verify_imports_neither_torch_nor_dgl(entry: str, stamped_store: Path) -> None:
    assert _heavy_modules(entry, "verify", str(stamped_store)) == ["numba"]


def test_info_of_a_store_not_opened_before_imports_neither_torch_nor_dgl(tmp_path: Path) -> None:
    path = write_store(tmp_path / "store", ArraySource(**random_graph_arrays()))
    assert set(_heavy_modules("script", "info", str(path))) <= {"numba"}
