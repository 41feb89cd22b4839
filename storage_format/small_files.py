"""The one owner of reading the small files gnnssd parses whole (configs, manifests,
calibration.json, metrics.jsonl, checkpoint headers, dataset metadata), and of parsing YAML
from anywhere (those files, `--set KEY=VALUE`): `parse_yaml`, bounded in the values its
aliases expand to and in its nesting.

Each is opened without following a symbolic link (O_NOFOLLOW) and without blocking (a
FIFO named like the file must not hang the caller), must be a regular file, and is read
only up to a size bound: a link to /dev/zero or a pipe is refused, not read forever.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import yaml

from .errors import shown

#: The default bound: far above any config, manifest or calibration file gnnssd writes.
SMALL_FILE_BYTES = 64 << 20
#: Values of a YAML document once its aliases are expanded (the 'billion laughs' bomb of a
#: few hundred bytes expands to billions).
MAX_YAML_NODES = 100_000


class SmallFileError(ValueError):
    """A small input file is missing, not a regular file, a link, too large or unreadable."""


def read_small(path: str | Path, limit: int = SMALL_FILE_BYTES, what: str = "file") -> bytes:
    """The bytes of the regular file `path` (not a link, at most `limit` bytes)."""
    return bytes(read_regular(path, limit, what))


def read_regular(path: str | Path, limit: int, what: str = "file") -> bytearray:
    """The whole regular file `path` (not a link, at most `limit` bytes) in one buffer of
    its size."""
    with opened_regular(path, limit, what) as (file, size):
        buffer = bytearray(size)
        view, done = memoryview(buffer), 0
        try:
            while done < len(buffer) and (n := file.readinto(view[done:])):
                done += n
            if done != len(buffer) or file.read(1):
                raise SmallFileError(f"{path}: changed size while being read; expected a {what} at rest")
        except OSError as exc:
            raise SmallFileError(f"{path}: cannot read the {what} ({exc.strerror})") from None
        return buffer


@contextlib.contextmanager
def opened_regular(path: str | Path, limit: int, what: str = "file") -> Iterator[tuple[BinaryIO, int]]:
    """The regular file `path` (not a link, not a FIFO or device, at most `limit` bytes)
    open for reading, and its size: for a reader that takes it in pieces (a checkpoint is
    read and hashed in chunks, never whole in one buffer)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SmallFileError(f"{path}: no such {what}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SmallFileError(f"{path}: is a symbolic link (to {os.readlink(path)}); gnnssd reads "
                                 f"a {what} only as a regular file, never through a link") from None
        raise SmallFileError(f"{path}: cannot open the {what} ({exc.strerror})") from None
    with os.fdopen(fd, "rb", buffering=0) as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(
                info.st_mode) else "a device or special file"
            raise SmallFileError(f"{path}: is {kind}, not a regular file; expected a {what}")
        if info.st_size > limit:
            raise SmallFileError(f"{path}: {info.st_size:,} bytes, more than the {limit:,} a {what} "
                                 "may hold")
        os.set_blocking(fd, True)
        yield file, info.st_size


def read_small_text(path: str | Path, limit: int = SMALL_FILE_BYTES, what: str = "file") -> str:
    """`read_small` decoded as UTF-8; an error names the file and the offending byte."""
    data = read_small(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SmallFileError(f"{path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset "
                             f"{exc.start}); expected a {what}") from None


def read_small_json(path: str | Path, limit: int = SMALL_FILE_BYTES, what: str = "JSON file") -> Any:
    """`read_small_text` parsed as JSON; an error names the file and the position."""
    text = read_small_text(path, limit, what)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SmallFileError(f"{path}: not valid JSON ({exc}); expected a {what}") from None
    except RecursionError:
        raise SmallFileError(f"{path}: not valid JSON (nested deeper than Python can parse); "
                             f"expected a {what}") from None


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader (plain values only: a tag such as !!python/object fails) that refuses
    duplicate keys (TOML and JSON schemas do too) and documents whose aliases expand past
    MAX_YAML_NODES values."""

    def construct_document(self, node: yaml.Node) -> Any:
        _count_nodes(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)} (each key may appear once)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _count_nodes(root: yaml.Node) -> None:
    """Walk the node graph as construction would expand it (without recursion), stopping
    past MAX_YAML_NODES."""
    count, stack = 0, [root]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise yaml.YAMLError(f"more than {MAX_YAML_NODES:,} values once its aliases are expanded "
                                 "(an alias bomb?)")
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in node.value for n in pair)


def parse_yaml(text: str, where: str) -> Any:
    """`text` as YAML (plain values), through the one bounded loader: alias bombs, nesting
    too deep to parse, duplicate keys and integers of more digits than Python converts are
    a one-line SmallFileError naming `where` (a file, or a `--set` key) and the fault."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise SmallFileError(f"{where}: not valid YAML: {_cut(problem)}{at}") from None
    except yaml.YAMLError as exc:
        raise SmallFileError(f"{where}: not valid YAML: {_cut(str(exc))}") from None
    except RecursionError:
        raise SmallFileError(f"{where}: not valid YAML: nested deeper than Python can parse") from None
    except ValueError as exc:  # an integer of more digits than int() converts
        raise SmallFileError(f"{where}: not valid YAML: {_cut(str(exc))}") from None


def _cut(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else f"{line[:limit]}..."


def read_small_yaml(path: str | Path, limit: int = SMALL_FILE_BYTES, what: str = "YAML file") -> Any:
    """`read_small_text` parsed by `parse_yaml`; an error names the file."""
    return parse_yaml(read_small_text(path, limit, what), str(path))
