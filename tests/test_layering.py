"""Each folder is one layer and imports only the layers below it (an AST scan of every
import, relative ones resolved, function-level ones included)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from .conftest import REPO

# package -> its folder, as setup.py installs them
FOLDERS = {"gnnssd.storage_format": "storage_format", "gnnssd.sampler": "sampler",
           "gnnssd.io_engine": "io_engine", "gnnssd.datasets": "datasets",
           "gnnssd.pipeline": "gnnssd/pipeline", "gnnssd.compiler": "gnnssd/compiler"}
# layer -> the gnnssd packages it may import besides itself. Everything else in gnnssd/ (the
# loaders, NodeLoader, Trainer, models, CLI) is the top layer and may import them all.
ALLOWED = {
    "gnnssd.storage_format": set(),
    "gnnssd.io_engine": set(),
    "gnnssd.sampler": {"gnnssd.storage_format"},
    "gnnssd.datasets": {"gnnssd.storage_format"},
    "gnnssd.pipeline": {"gnnssd.storage_format", "gnnssd.sampler", "gnnssd.io_engine"},
    "gnnssd.compiler": set(),
}
# The bare package (gnnssd/__init__.py: the version, and public names imported lazily).
ROOT = "gnnssd"


def _module(path: Path, package: str, folder: str) -> str:
    parts = path.relative_to(REPO / folder).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((package, *parts))


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `path`."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _layer_of(name: str) -> str | None:
    return next((layer for layer in FOLDERS if name == layer or name.startswith(layer + ".")), None)


def _violations(package: str, folder: str) -> list[str]:
    allowed = ALLOWED[package] | {package}
    bad = []
    for path in sorted((REPO / folder).rglob("*.py")):
        module = _module(path, package, folder)
        for line, name in _imports(path, module):
            if not name.startswith(ROOT + "."):
                continue
            if _layer_of(name) not in allowed:
                bad.append(f"{path.relative_to(REPO)}:{line}: {package} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_goes_up_a_layer(package: str) -> None:
    assert _violations(package, FOLDERS[package]) == []


def test_the_scan_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a store module importing the sampler (as order.py once did),
    relatively and absolutely, inside a function, is reported."""
    folder = tmp_path / "storage_format"
    folder.mkdir()
    (folder / "__init__.py").write_text("from .order import x\n")
    (folder / "order.py").write_text("def f():\n    from gnnssd.sampler.order import degree_order\n"
                                     "    from ..trainer import Trainer\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    bad = _violations("gnnssd.storage_format", "storage_format")
    assert bad == ["storage_format/order.py:2: gnnssd.storage_format imports gnnssd.sampler.order",
                   "storage_format/order.py:3: gnnssd.storage_format imports gnnssd.trainer"]
