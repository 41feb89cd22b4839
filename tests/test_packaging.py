"""The wheel built from the repository installs into a fresh virtual environment and
trains there: every subpackage is in it, and so is the compiled io_engine.

The fresh environment takes its third-party packages (torch, dgl, ...: the locked versions)
from the project's own environment through a path file instead of installing them again,
and the wheel goes in with --no-deps: what is tested is the wheel, not the resolver."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

# In the fresh environment: the demo (1 epoch), then the ssd loader through the wheel's
# io_engine, and the compiler's package (a subpackage the old package list left out).
SCRIPT = """
import sys
from pathlib import Path
import numpy as np
import gnnssd
import gnnssd.io_engine._gnnssd_io as engine_lib
for module in (gnnssd, engine_lib):  # from the wheel, not from the project's editable install
    assert module.__file__.startswith(sys.prefix), (module.__file__, sys.prefix)
from gnnssd.cli.demo import run_demo
out = Path(sys.argv[1])
run_demo(out, epochs=1)
store = gnnssd.Store.open(out / "store")
with gnnssd.NodeLoader(store, store.train_idx, fanouts=[5, 5], batch_size=256, features="ssd",
                       memory_budget="32MiB", shuffle=True, device="cpu") as loader:
    features = store.features_memmap()
    batches = list(loader)
    assert len(batches) == len(loader) > 0
    for mb in batches:
        assert np.array_equal(mb.x.numpy(), features[np.asarray(store.inv)[mb.input_nodes.numpy()]])
import gnnssd.compiler.passes, gnnssd.compiler.kernels, gnnssd.pipeline
print("wheel ok")
"""


def _uv() -> list[str]:
    found = shutil.which("uv")
    if found:
        return [found]
    if subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "uv"]
    pytest.skip("uv is not installed (make setup installs it)")


def _source_tree(dest: Path) -> Path:
    """The repository's files as a clean clone of the working tree has them (tracked and
    new files, none that git ignores: no build outputs, no virtual environment)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("the repository is not a git work tree")
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.timeout(600)
def test_wheel_installs_in_a_fresh_venv_and_trains(tmp_path: Path) -> None:
    uv = _uv()

    def run(*args: str | Path, cwd: Path = tmp_path) -> str:
        done = subprocess.run([*map(str, args)], cwd=cwd, capture_output=True, text=True)
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    src = _source_tree(tmp_path / "src")
    run(*uv, "build", "--wheel", "--out-dir", tmp_path / "dist", src)
    wheel = next((tmp_path / "dist").glob("gnnssd-*.whl"))
    venv = tmp_path / "venv"
    run(*uv, "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    # after the fresh site-packages on sys.path: a plain path line, so the project's own
    # path files (its editable gnnssd) are not read
    (site / "project_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run(*uv, "pip", "install", "--quiet", "--no-deps", "--python", python, wheel)
    out = run(python, "-c", SCRIPT, tmp_path / "demo", cwd=tmp_path)
    assert "demo test accuracy" in out and "wheel ok" in out
