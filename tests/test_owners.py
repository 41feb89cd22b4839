"""Each class of file fault has one owner, and the raw call it replaces appears nowhere else
(an AST scan of the code, as test_layering scans imports):

- files created, replaced, truncated or rewritten in place: `storage_format.atomic` (a fresh
  O_EXCL|O_NOFOLLOW temporary, fsync, rename; no non-regular target replaced; nothing written
  inside a store at any depth; a working file of a command's own folder, such as a resumed
  preprocess's arrays and spills, opened O_NOFOLLOW, regular and single-linked, inside that
  folder; lock files likewise);
- small files read whole: `storage_format.small_files` (regular file, no link, bounded);
- pickles and torch files: `datasets.torch_file` (restricted, never torch.load) and the
  allow-list unpickler of `datasets.base` (Planetoid's pickles);
- paths named by a dataset's files: `storage_format.paths.contained`;
- YAML parsed from anywhere (config files, `--set`, dataset metadata):
  `storage_format.small_files.parse_yaml` (alias bombs, nesting, duplicate keys bounded);
- environment variables read: `storage_format.environment` (each value checked, named when wrong);
- a value quoted in a message: `storage_format.shown`, never a repr built whole and then
  cut (`{value!r:.100}`), which no module may write.

A module outside an owner that still makes such a call is listed in EXCEPTIONS with the
reason the call is safe there; an exception no longer needed fails the test too.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

FOLDERS = ("gnnssd", "storage_format", "datasets", "sampler", "io_engine")
OWNERS = {
    "write": {"storage_format/atomic.py"},
    "read": {"storage_format/small_files.py"},
    "unpickle": {"datasets/torch_file.py", "datasets/base.py"},
    "yaml": {"storage_format/small_files.py"},
    "environ": {"storage_format/environment.py"},
    "cut repr": set(),
}
# (module, rule) -> why the raw call is safe there
EXCEPTIONS = {
    ("io_engine/build_ffi.py", "write"): "build time: writes the generated C source of the engine",
    ("storage_format/preprocess/steps.py", "write"): "/proc/self/clear_refs (resets the peak RSS counter)",
    ("storage_format/preprocess/steps.py", "read"): "/proc/self counters (peak RSS, bytes written)",
    ("gnnssd/pipeline/block_writer.py", "write"): "compact blocks in this process's own scratch directory "
                                                  "(O_DIRECT needs its own open)",
    ("gnnssd/training/rundir.py", "write"): "the run's lock file: opened O_NOFOLLOW, checked regular and "
                                            "single-linked before it is truncated (shared or exclusive, "
                                            "read-only fallback: not atomic.exclusive_lock's)",
    ("io_engine/crc.py", "environ"): "GNNSSD_PAGE_CRC, checked against its choices and named; the engine's "
                                     "layer imports no other",
    ("io_engine/build_ffi.py", "environ"): "build time: GNNSSD_IO_NO_URING=1 builds without io_uring",
    ("gnnssd/core/allocator.py", "environ"): "logs the user's PYTORCH_CUDA_ALLOC_CONF, which it leaves as it is",
    ("gnnssd/compiler/kernels/triton_spmm.py", "environ"): "TRITON_INTERPRET, triton's own switch, compared to '1'",
}
YAML_CALLS = {f"yaml.{name}" for name in ("load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all",
                                          "full_load_all", "unsafe_load_all", "compose", "compose_all", "parse", "scan")}
WRITE_MODES = set("wax+")
#: Functions that map a file, and the position of their mode argument.
MAPS = {"memmap": 2, "open_memmap": 1}


def _module_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py") if ".venv" not in p.parts)


def _name(node: ast.AST) -> str:
    """`a.b.c` of a Name/Attribute chain ('' for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else f"?.{node.attr}"
    return ""


def _mode(call: ast.Call, position: int) -> str:
    """Every character of the mode strings an open call may get ("r+b" if x else "w+b" too)."""
    arg = call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return "".join(n.value for n in ast.walk(arg) if isinstance(n, ast.Constant) and isinstance(n.value, str)) \
        if arg is not None else ""


def _may_write(flags: ast.AST) -> bool:
    """os.open flags that create or write, or that the scan cannot read (a variable)."""
    inner = {id(n.value) for n in ast.walk(flags) if isinstance(n, ast.Attribute)}
    names = [_name(n) for n in ast.walk(flags) if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in inner]
    return any(n.endswith(("O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC")) or "." not in n for n in names)


def _rules(call: ast.Call) -> list[str]:
    """Which owner's raw call `call` is."""
    name = _name(call.func)
    last = name.rsplit(".", 1)[-1]
    found = []
    if name in ("open", "io.open", "gzip.open", "bz2.open", "lzma.open") and set(_mode(call, 1)) & WRITE_MODES:
        found.append("write")
    if name == "os.open" and len(call.args) > 1 and _may_write(call.args[1]):
        found.append("write")
    if last in ("write_text", "write_bytes", "tofile", "truncate", "ftruncate") or name in (
            "torch.save", "shutil.copyfile", "shutil.copy"):
        found.append("write")
    if last in MAPS and set(_mode(call, MAPS[last]) or "r+") & WRITE_MODES and call.args and not isinstance(
            call.args[0], ast.Name):
        found.append("write")  # mapped for writing (np.memmap's default r+) by its path, not a file the owner opened
    if name in ("np.save", "np.savez", "np.savez_compressed", "numpy.save") and call.args and not isinstance(
            call.args[0], ast.Name):
        found.append("write")  # to a path: not a file the owner opened
    if last in ("read_text", "read_bytes"):
        found.append("read")
    if name in ("json.load", "yaml.safe_load", "yaml.load") and call.args and isinstance(
            call.args[0], ast.Call) and _name(call.args[0].func) == "open":
        found.append("read")
    if name in YAML_CALLS:
        found.append("yaml")
    if name in ("os.getenv", "os.environ.get"):
        found.append("environ")
    if name in ("torch.load", "pickle.load", "pickle.loads", "pickle.Unpickler") or (
            name in ("np.load", "numpy.load") and any(k.arg == "allow_pickle" and not (
                isinstance(k.value, ast.Constant) and k.value.value is False) for k in call.keywords)):
        found.append("unpickle")
    return found


def raw_calls(files: list[Path], root: Path) -> dict[tuple[str, str], list[int]]:
    """(module, rule) -> lines of the raw calls outside the rule's owner."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in files:
        module = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                    _name(b).endswith("Unpickler") and _name(b) != "AllowListUnpickler" for b in node.bases):
                rules = ["unpickle"]
            elif isinstance(node, ast.ClassDef) and any(_name(b).startswith("yaml.") for b in node.bases):
                rules = ["yaml"]  # a loader of its own
            elif isinstance(node, ast.Call):
                rules = _rules(node)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _name(node.value) == "os.environ":
                rules = ["environ"]
            elif isinstance(node, ast.FormattedValue) and node.conversion == ord("r") and node.format_spec is not None:
                rules = ["cut repr"]  # {value!r:.100}: the whole repr is built, then cut
            else:
                continue
            for rule in rules:
                if module not in OWNERS[rule]:
                    found.setdefault((module, rule), []).append(node.lineno)
    return {key: sorted(lines) for key, lines in found.items()}


def test_raw_file_calls_only_in_their_owner() -> None:
    found = raw_calls(_module_files(), REPO)
    unexplained = {f"{m}:{lines} {rule}" for (m, rule), lines in found.items() if (m, rule) not in EXCEPTIONS}
    assert sorted(unexplained) == []
    stale = sorted(f"{m} {rule}" for m, rule in EXCEPTIONS if (m, rule) not in found)
    assert stale == []


def test_the_scan_sees_each_raw_call(tmp_path: Path) -> None:
    """The check can fail: each raw call it replaces, written outside its owner, is found."""
    (tmp_path / "m.py").write_text(
        "import json, pickle, torch, numpy as np, os\n"
        "open(p, 'w')\nopen(p, mode='ab')\np.write_text('x')\np.write_bytes(b'')\n"
        "torch.save(x, p)\nnp.save(out / 'a.npy', x)\nos.open(p, os.O_WRONLY | os.O_CREAT)\n"
        "p.read_text()\njson.load(open(p))\n"
        "torch.load(p)\npickle.loads(b)\nnp.load(p, allow_pickle=True)\nclass U(pickle.Unpickler): pass\n"
        "open(p, 'r+b' if e else 'w+b')\nos.open(p, flags)\n"
        "open(p)\nnp.save(f, x)\nnp.load(p, allow_pickle=False)\nos.open(p, os.O_RDONLY | os.O_NOFOLLOW)\n"
        "f.truncate(0)\nos.ftruncate(fd, 0)\nx.tofile(out / 'x.bin')\nnp.save(scratch / 'd.npy', d)\n"
        "np.lib.format.open_memmap(out / 'i.npy', mode='w+', dtype=t, shape=s)\nnp.memmap(out / 'f.bin', t)\n"
        "np.memmap(out / 'f.bin', t, 'r+')\nnp.memmap(out / 'f.bin', t, mode='r')\nnp.memmap(f, t, mode='r+')\n"
        "os.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)\n"
        "yaml.safe_load(text)\nyaml.load(text, Loader=L)\nclass L(yaml.SafeLoader): pass\n"
        "os.environ.get('RANK')\nos.environ['RANK']\nos.getenv('X')\nf'{value!r:.100}'\n"
        "os.environ.setdefault('A', 'b')\n'RANK' in os.environ\nf'{value!r}'\nyaml.safe_dump(x)\n")
    found = raw_calls([tmp_path / "m.py"], tmp_path)
    assert found == {("m.py", "write"): [2, 3, 4, 5, 6, 7, 8, 15, 16, 21, 22, 23, 24, 25, 26, 27, 30],
                     ("m.py", "read"): [9, 10], ("m.py", "unpickle"): [11, 12, 13, 14], ("m.py", "yaml"): [31, 32, 33],
                     ("m.py", "environ"): [34, 35, 36], ("m.py", "cut repr"): [37]}
