"""Each folder is one layer and imports only the layers below it, never the bare gnnssd
package above them all, and the modules of one layer import each other without a cycle
(an AST scan of every import, relative ones resolved, function-level and TYPE_CHECKING
ones included)."""
from __future__ import annotations

import ast
import importlib
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

from tests.conftest import REPO

# package -> its folder, as setup.py installs them
FOLDERS = {"gnnssd.storage_format": "storage_format", "gnnssd.sampler": "sampler",
           "gnnssd.io_engine": "io_engine", "gnnssd.datasets": "datasets",
           "gnnssd.pipeline": "gnnssd/pipeline", "gnnssd.compiler": "gnnssd/compiler",
           "gnnssd.core": "gnnssd/core", "gnnssd.loading": "gnnssd/loading", "gnnssd.models": "gnnssd/models",
           "gnnssd.training": "gnnssd/training", "gnnssd.inference": "gnnssd/inference", "gnnssd.cli": "gnnssd/cli"}
_LOWER = {"gnnssd.storage_format", "gnnssd.sampler", "gnnssd.io_engine", "gnnssd.pipeline"}
# layer -> the gnnssd packages it may import besides itself: the store, sampler, engine and
# pipeline at the bottom; above them core < loading < models < training < inference < cli.
ALLOWED = {
    "gnnssd.storage_format": set(),
    "gnnssd.io_engine": set(),
    "gnnssd.sampler": {"gnnssd.storage_format"},
    "gnnssd.datasets": {"gnnssd.storage_format"},
    "gnnssd.pipeline": {"gnnssd.storage_format", "gnnssd.sampler", "gnnssd.io_engine"},
    "gnnssd.compiler": set(),
    "gnnssd.core": {"gnnssd.storage_format", "gnnssd.sampler"},
    "gnnssd.loading": _LOWER | {"gnnssd.core", "gnnssd.compiler"},
    "gnnssd.models": {"gnnssd.storage_format", "gnnssd.compiler", "gnnssd.core"},
    "gnnssd.training": _LOWER | {"gnnssd.core", "gnnssd.loading", "gnnssd.models"},
    "gnnssd.inference": _LOWER | {"gnnssd.core", "gnnssd.loading", "gnnssd.models"},
    "gnnssd.cli": _LOWER | {"gnnssd.datasets", "gnnssd.core", "gnnssd.loading", "gnnssd.models",
                            "gnnssd.training", "gnnssd.inference"},
}
# The bare package (gnnssd/__init__.py: the version, and public names imported lazily).
ROOT = "gnnssd"
# The top layer: the modules of gnnssd/ outside the folders above (__init__, __main__).
TOP = ROOT


def _module(path: Path, package: str, folder: str) -> str:
    parts = path.relative_to(REPO / folder).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((package, *parts))


def _imports(path: Path, module: str, known: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `path`; `from P import m` names P.m
    when that is one of the `known` modules."""
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
            found += sorted({(node.lineno, f"{name}.{alias.name}" if f"{name}.{alias.name}" in known else name)
                             for alias in node.names})
    return sorted(found)


def _layer_of(name: str) -> str | None:
    return next((layer for layer in FOLDERS if name == layer or name.startswith(layer + ".")), None)


def _violations(package: str, folder: str) -> list[str]:
    allowed = ALLOWED[package] | {package}
    bad = []
    for path in sorted((REPO / folder).rglob("*.py")):
        module = _module(path, package, folder)
        for line, name in _imports(path, module, set(FOLDERS)):
            if name != ROOT and not name.startswith(ROOT + "."):
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


def _layer_modules(layer: str) -> dict[str, Path]:
    """The modules of one layer (a package of FOLDERS, or TOP: gnnssd/ outside them) -> file."""
    if layer != TOP:
        folder = REPO / FOLDERS[layer]
        return {_module(path, layer, FOLDERS[layer]): path for path in sorted(folder.rglob("*.py"))}
    inner = [REPO / folder for folder in FOLDERS.values()]
    return {_module(path, TOP, TOP): path for path in sorted((REPO / TOP).rglob("*.py"))
            if not any(path.is_relative_to(folder) for folder in inner)}


def _cycles(layer: str) -> list[str]:
    """The import cycles among the layer's modules (the shortest through each module), each
    as its chain of modules with the file and line of each import."""
    modules = _layer_modules(layer)
    edges: dict[str, dict[str, str]] = {m: {} for m in modules}  # module -> imported -> where
    for module, path in modules.items():
        for line, name in _imports(path, module, set(modules)):
            if name in modules:  # (not the compiled extension, not another layer)
                edges[module].setdefault(name, f"{path.relative_to(REPO)}:{line}")
    found = {}
    for start in sorted(edges):  # a cycle is named from its first module
        chain = _path_back(edges, start)
        if chain and frozenset(chain) not in found:
            where = ", ".join(edges[a][b] for a, b in zip(chain, chain[1:]))
            found[frozenset(chain)] = f"{' -> '.join(chain)} ({where})"
    return sorted(found.values())


def _path_back(edges: dict[str, dict[str, str]], start: str) -> list[str] | None:
    """The shortest chain of imports start -> ... -> start (breadth first), if any."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w == start:
                    chain = [v]
                    while chain[-1] != start:
                        chain.append(came[chain[-1]])
                    return [*reversed(chain), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    return None


@pytest.mark.parametrize("layer", sorted([*FOLDERS, TOP]))
def test_no_import_cycle_inside_a_layer(layer: str) -> None:
    cycles = _cycles(layer)
    assert not cycles, f"import cycles in {layer}:\n" + "\n".join(cycles)


def test_the_scan_sees_an_import_of_the_bare_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lower layer reading the version off the gnnssd package (as writer.py once did) is
    reported, however it is imported; `from gnnssd import sampler` is the sampler."""
    folder = tmp_path / "storage_format"
    folder.mkdir()
    (folder / "writer.py").write_text("def f():\n    from gnnssd import __version__\n"
                                      "import gnnssd\nfrom gnnssd import sampler\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    bad = _violations("gnnssd.storage_format", "storage_format")
    assert bad == ["storage_format/writer.py:2: gnnssd.storage_format imports gnnssd",
                   "storage_format/writer.py:3: gnnssd.storage_format imports gnnssd",
                   "storage_format/writer.py:4: gnnssd.storage_format imports gnnssd.sampler"]


def test_the_scan_names_an_import_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: cycles through a TYPE_CHECKING import and a function-level one
    (as layerwise_mean and io_engine's rows once had), and one through a package's
    __init__, in the top layer and in a lower one, each reported as its chain of modules."""
    (tmp_path / "gnnssd" / "pipeline").mkdir(parents=True)
    (tmp_path / "gnnssd" / "__init__.py").write_text("")
    (tmp_path / "gnnssd" / "layerwise.py").write_text("from .layerwise_mean import mean_layer_chunks\n")
    (tmp_path / "gnnssd" / "layerwise_mean.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gnnssd import layerwise\n")
    (tmp_path / "gnnssd" / "pipeline" / "loader.py").write_text("from ..layerwise import x\n")  # another layer
    folder = tmp_path / "io_engine"
    folder.mkdir()
    (folder / "__init__.py").write_text("from .engine import Engine\n")
    (folder / "engine.py").write_text("import numpy\nfrom .rows import read_rows\n")
    (folder / "rows.py").write_text("def read_rows():\n    from gnnssd.io_engine import Engine\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _cycles(TOP) == ["gnnssd.layerwise -> gnnssd.layerwise_mean -> gnnssd.layerwise "
                            "(gnnssd/layerwise.py:1, gnnssd/layerwise_mean.py:3)"]
    assert _cycles("gnnssd.io_engine") == [
        "gnnssd.io_engine -> gnnssd.io_engine.engine -> gnnssd.io_engine.rows -> gnnssd.io_engine "
        "(io_engine/__init__.py:1, io_engine/engine.py:2, io_engine/rows.py:2)"]


def test_the_store_records_the_version_of_the_package() -> None:
    """The store layer reads gnnssd's version from the package metadata, not the package."""
    import gnnssd
    from gnnssd.storage_format.preprocess.writer import _version

    assert _version() == gnnssd.__version__


def _production_modules() -> dict[str, Path]:
    """Every module of the installed package: the top layer and each folder's."""
    return {module: path for layer in [*FOLDERS, TOP] for module, path in _layer_modules(layer).items()}


def _imported_names(path: Path, module: str) -> list[tuple[int, str, str]]:
    """(line, module, name) of every `from module import name` in `path`, relative ones resolved."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = module.split(".")[: len(module.split(".")) - node.level + is_package] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, name, alias.name) for alias in node.names]
    return found


def _reaches_inside() -> list[str]:
    """Imports of another layer's module rather than its package, or of a name the
    package does not export."""
    bad = []
    for module, path in _production_modules().items():
        for line, name, alias in _imported_names(path, module):
            layer = _layer_of(name)
            if layer is None or layer == _layer_of(module):
                continue
            if name != layer:
                bad.append(f"{path.relative_to(REPO)}:{line}: {module} imports {name}; import {layer}")
            elif alias not in importlib.import_module(layer).__all__:
                bad.append(f"{path.relative_to(REPO)}:{line}: {module} imports {alias}, which {layer} does not export")
    return bad


def test_other_layers_import_a_package_not_its_modules() -> None:
    """A folder's __init__ is its interface: the layers above import what it exports."""
    assert _reaches_inside() == []


def _documented(name: str) -> bool:
    """Named for users: in a README or an example."""
    texts = [*REPO.glob("*.md"), *REPO.glob("*/README.md"), *REPO.glob("gnnssd/*/README.md"), *REPO.glob("examples/*.py")]
    return any(re.search(rf"\b{re.escape(name)}\b", path.read_text()) for path in texts)


@pytest.mark.parametrize("package", sorted(FOLDERS))
def test_a_package_exports_what_other_layers_or_users_use(package: str) -> None:
    """Each exported name is imported from the package by another layer, public as gnnssd.X, or
    documented for users; names only tests use are imported from their own module."""
    used = {alias for module, path in _production_modules().items() if _layer_of(module) != package
            for _, name, alias in _imported_names(path, module) if name == package}
    attributes = re.compile(rf"\b{package.rsplit('.', 1)[1]}\.(\w+)")  # `datasets.X` after `from gnnssd import datasets`
    used |= {m for path in _production_modules().values() for m in attributes.findall(path.read_text())}
    import gnnssd

    used |= {name for name, home in gnnssd._PUBLIC.items() if f"gnnssd{home}" == package}  # gnnssd.X
    exported = importlib.import_module(package).__all__
    assert [name for name in exported if name not in used and not _documented(name)] == []


def test_the_scan_sees_an_import_of_another_layers_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the top layer importing a pipeline module, relatively or not,
    or a name the package keeps to itself."""
    (tmp_path / "gnnssd" / "pipeline").mkdir(parents=True)
    (tmp_path / "gnnssd" / "loader.py").write_text("from .pipeline.buffers import BUFFERS\n"
                                                   "from gnnssd.pipeline import DirectIO, hottest_rows\n"
                                                   "def f():\n    from gnnssd.sampler.order import hotness\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert _reaches_inside() == [
        "gnnssd/loader.py:1: gnnssd.loader imports gnnssd.pipeline.buffers; import gnnssd.pipeline",
        "gnnssd/loader.py:2: gnnssd.loader imports hottest_rows, which gnnssd.pipeline does not export",
        "gnnssd/loader.py:4: gnnssd.loader imports gnnssd.sampler.order; import gnnssd.sampler"]


# --- the graph's kind: one shape for every graph (issue 45) --------------------------------
# What counts as asking which kind of graph a body holds, per line of code (comments and
# strings blanked first, so a docstring naming them is not counted):
KIND_CHECKS = {
    # the schema asked whether it is the one-type, one-relation case
    "is_homogeneous": re.compile(r"\bis_homogeneous\b"),
    # edge types as None for one relation (they are an array, empty for one relation)
    "etypes is None": re.compile(r"\betypes is (not )?None\b"),
    # a conditional expression on the kind: `A if typed else B`, `... if len(etypes) else ...`
    "typed ternary": re.compile(r"\S.*\bif (not )?[\w.()]*\b(typed|typed_form|is_homogeneous|etypes|edge_type)\b"
                                r"[\w.()]* else\b"),
    # a value's shape asked: a dict by node type or relation, or a plain tensor/array/int
    "isinstance dict": re.compile(r"\bisinstance\((\w+\.)*(x|seeds?|fanouts?|f|\w*ids|\w*nodes|labels|edges), dict\)"),
}
KIND_FOLDERS = ("gnnssd", "sampler", "storage_format")
# Layers that never ask: their bodies hold one shape (sampler/ picks its hop kernel by the
# edge types' length, not by a kind).
KIND_FREE = ("sampler", "gnnssd/pipeline", "gnnssd/loading/backends")
KIND_FREE_PATTERNS = ("is_homogeneous", "etypes is None")
# The one module of those layers that may: the fanouts value lives in sampler/ so that the
# config parses it without numba, and gives DGL's form (ints, or dicts by relation).
KIND_FREE_EXCEPT = ("sampler/fanouts.py",)
# Where the kind is still asked, with how many lines (14 in all, from 54; issue 45's target is
# 15): the GraphBolt export, the manifest's schema (read by the store, written by preprocess),
# the model family, the one block-form function, and the sampler's own fanouts and kernels.
# Each of these asks once and hands the others a shape (the store's and preprocess's parts by
# kind, form.py's BlockForm), so no other file asks.
KIND_BOUNDARIES = {
    "storage_format/schema.py": 1,  # the definition
    # the manifest's schema read: the store's parts by kind (etypes, its checks, the link
    # relation, DGL's graph, `info`'s types), chosen once (Store._kind)
    "storage_format/store.py": 1,
    # the manifest's schema written, and preprocess's options and topology parts (schema_parts)
    "storage_format/preprocess/writer.py": 1,
    "sampler/fanouts.py": 2,  # the fanouts value: DGL's form, relation dicts refused on one relation
    "sampler/sampling.py": 4,  # the sampler's own hop kernel choice, and the LABOR kernel's one-relation runs
    # the one block-form function (typed_form), each form's blocks and nodes (block_form),
    # nodes, labels and edges by type (by_type)
    "gnnssd/loading/form.py": 3,
    "gnnssd/models/builtin.py": 1,  # the model family
    "gnnssd/cli/export.py": 1,  # the GraphBolt export's names (its homogeneous form names no type)
}


def _code_lines(path: Path) -> dict[int, str]:
    """Line number -> the line with its comments and string literals blanked."""
    text = path.read_text()
    lines = text.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            (r0, c0), (r1, c1) = token.start, token.end
            for r in range(r0, r1 + 1):
                line = lines[r - 1]
                a, b = (c0 if r == r0 else 0), (c1 if r == r1 else len(line))
                lines[r - 1] = line[:a] + " " * (b - a) + line[b:]
    return dict(enumerate(lines, 1))


def kind_checks(root: Path, folders: tuple[str, ...]) -> dict[str, list[tuple[int, str]]]:
    """file -> (line, the first of KIND_CHECKS it matches) of every line that asks the kind."""
    found: dict[str, list[tuple[int, str]]] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for number, line in _code_lines(path).items():
                kind = next((name for name, pattern in KIND_CHECKS.items() if pattern.search(line)), None)
                if kind:
                    found.setdefault(path.relative_to(root).as_posix(), []).append((number, kind))
    return found


def test_the_lower_layers_never_ask_the_graphs_kind() -> None:
    """sampler/, pipeline/ and loading/backends/ hold one shape: the twins do not grow back."""
    found = kind_checks(REPO, KIND_FOLDERS)
    asked = [f"{path}:{line} {kind}" for path, lines in found.items() for line, kind in lines
             if path.startswith(KIND_FREE) and path not in KIND_FREE_EXCEPT and kind in KIND_FREE_PATTERNS]
    assert asked == []


def test_the_graphs_kind_is_asked_only_at_its_boundaries() -> None:
    """Each line asking the kind is in a boundary file, and each boundary asks exactly as
    often as KIND_BOUNDARIES says: a new file asking fails, and so does one asking less
    (lower its count: the ratchet only goes down, toward issue 45's 15)."""
    found = {path: len(lines) for path, lines in kind_checks(REPO, KIND_FOLDERS).items()}
    assert found == KIND_BOUNDARIES


def test_the_kind_scan_sees_each_pattern(tmp_path: Path) -> None:
    """The check can fail: each pattern, in code, is found; in a docstring or comment it is not."""
    folder = tmp_path / "sampler"
    folder.mkdir()
    (folder / "m.py").write_text(
        '"""is_homogeneous in a docstring"""\n'
        "if schema.is_homogeneous:  # etypes is None\n"
        "    pass\n"
        "rels = None if self.etypes is None else rels\n"
        "x = a if typed else b\n"
        "if isinstance(batch.x, dict):\n"
        "    pass\n"
        "if isinstance(output_nodes, dict) and etypes is not None:\n"
        "    pass\n"
        "y = f'{etypes is None}'\n")
    assert kind_checks(tmp_path, ("sampler",)) == {
        "sampler/m.py": [(2, "is_homogeneous"), (4, "etypes is None"), (5, "typed ternary"),
                         (6, "isinstance dict"), (8, "etypes is None")]}


# The layers that write stores: the commands (preprocess, export, the demo) and the dataset
# sources they read. Everything else reads a store and never imports its preprocessing.
PREPROCESS = "gnnssd.storage_format.preprocess"
WRITERS = {"gnnssd.cli", "gnnssd.datasets"}


def _preprocess_imports(package: str, folder: str) -> list[str]:
    """Where `package` imports storage_format's preprocessing modules: directly, or through a
    name the storage_format package exports lazily from one of them."""
    from gnnssd import storage_format

    via_package = {f"gnnssd.storage_format.{name}" for name, module in storage_format._EXPORTS.items()
                   if module.startswith(".preprocess.")}
    bad = []
    for path in sorted((REPO / folder).rglob("*.py")):
        module = _module(path, package, folder)
        if module == PREPROCESS or module.startswith(PREPROCESS + "."):
            continue
        bad += [f"{path.relative_to(REPO)}:{line}: {package} imports {name}"
                for line, name in _imports(path, module, via_package)
                if name in via_package or name == PREPROCESS or name.startswith(PREPROCESS + ".")]
    return bad


@pytest.mark.parametrize("package", sorted(set(ALLOWED) - WRITERS))
def test_the_reading_side_never_imports_preprocessing(package: str) -> None:
    assert _preprocess_imports(package, FOLDERS[package]) == []
