"""A file of tensors and plain values that needs no unpickling to read (the checkpoint format).

Layout: MAGIC, the header's length (8 bytes, little-endian), the header (UTF-8 JSON: the
value tree with each tensor replaced by its index, and per tensor its dtype, shape, offset
and length), the tensors' raw bytes, then the SHA-256 of everything before it. Reading
parses JSON and copies bytes into tensors of an allowed dtype: no code a file names can
run (torch 2.2.1's `weights_only` loader has published bypasses), and a flipped byte is
found before anything is used.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
from typing import Any, BinaryIO

import torch

from gnnssd.storage_format import shown

MAGIC = b"GNNSSD-STATE-2\n"
DIGEST = 32
CHUNK = 8 << 20  # bytes read and hashed at a time
ALIGN = 64
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


class StateFileError(ValueError):
    """The bytes are not a readable state file; the message says what is wrong where."""


def encode_state(tree: Any) -> bytes:
    """`tree` (dicts, lists, tuples, str, int, float, bool, None and CPU-copyable tensors)
    as a state file's bytes; anything else is a TypeError naming where it sits."""
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    offset = 0

    def enc(value: Any, where: str) -> Any:
        nonlocal offset
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            name = str(t.dtype).removeprefix("torch.")
            if name not in DTYPES:
                raise TypeError(f"{where}: a tensor of dtype {t.dtype}, not one of {sorted(DTYPES)}")
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            pad = -offset % ALIGN
            blobs.append(b"\0" * pad + raw)
            offset += pad
            tensors.append({"dtype": name, "shape": list(t.shape), "offset": offset, "nbytes": len(raw)})
            offset += len(raw)
            return {"$tensor": len(tensors) - 1}
        if isinstance(value, (list, tuple)):
            items = [enc(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return items if isinstance(value, list) else {"$tuple": items}
        if isinstance(value, dict):
            return {"$dict": [[enc(k, f"{where} key"), enc(v, f"{where}[{k!r}]")] for k, v in value.items()]}
        raise TypeError(f"{where}: a {type(value).__name__}; a state file holds tensors and plain values only")

    header = json.dumps({"tree": enc(tree, "state"), "tensors": tensors}, allow_nan=False).encode()
    body = MAGIC + len(header).to_bytes(8, "little") + header + b"".join(blobs)
    return body + hashlib.sha256(body).digest()


def decode_state(data: bytes | bytearray) -> Any:
    """The tree of a state file's bytes (`read_state` of them)."""
    return read_state(io.BytesIO(data), len(data))


def read_state(file: BinaryIO, size: int) -> Any:
    """The tree of the state file of `size` bytes that `file` reads from its start, read
    and hashed in CHUNK pieces: each tensor's bytes go straight into its tensor (no buffer
    of the whole file, no second copy), and nothing is returned before the SHA-256 of all
    of it matches. A fault of the layout is reported as corruption when the digest does
    not match either (a flipped byte in the header is damage, not a format). StateFileError
    on any fault; never runs code."""
    start = _read_exact(file, min(size, len(MAGIC)))
    if start != MAGIC:
        raise StateFileError(f"does not start with {MAGIC!r}")
    if size < len(MAGIC) + 8 + DIGEST:
        raise StateFileError(f"{size} bytes: shorter than a state file's fixed parts")
    reader = _HashedReader(file, start, size - DIGEST)
    fault = None
    try:
        tree, tensors = _read_body(reader)
    except StateFileError as exc:
        fault = exc
    reader.hash_to(reader.end)
    if reader.digest.digest() != _read_exact(file, DIGEST):
        raise StateFileError("corrupt: its SHA-256 does not match the recorded one (a damaged file)")
    if fault is not None:
        raise fault
    try:
        return _decode(tree, tensors, "state")
    except RecursionError:
        raise StateFileError("its tree is nested deeper than Python can follow") from None


class _HashedReader:
    """The hashed part of a state file (everything before its digest), read in order."""

    def __init__(self, file: BinaryIO, start: bytes, end: int):
        self.file, self.end, self.pos = file, end, len(start)
        self.digest = hashlib.sha256(start)

    def read(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise StateFileError(f"{n:,} bytes at offset {self.pos:,} run past the end of the file")
        data = _read_exact(self.file, n)
        self.digest.update(data)
        self.pos += n
        return data

    def read_into(self, view: memoryview) -> None:
        for start in range(0, len(view), CHUNK):
            piece = view[start:start + CHUNK]
            _read_into(self.file, piece)
            self.digest.update(piece)
        self.pos += len(view)

    def hash_to(self, pos: int) -> None:
        """Hash the bytes up to offset `pos` (padding, or the rest after a fault)."""
        while self.pos < pos:
            self.read(min(CHUNK, pos - self.pos))


def _read_exact(file: BinaryIO, n: int) -> bytes:
    data = file.read(n)
    if len(data) != n:
        raise StateFileError("the file ended early (it changed size while being read)")
    return data


def _read_into(file: BinaryIO, view: memoryview) -> None:
    done = 0
    while done < len(view):
        n = file.readinto(view[done:])
        if not n:
            raise StateFileError("the file ended early (it changed size while being read)")
        done += n


def _read_body(reader: _HashedReader) -> tuple[Any, list[torch.Tensor]]:
    """The header's tree and the tensors, read in file order (the tensors' bytes unverified
    until the caller checks the digest)."""
    size = int.from_bytes(reader.read(8), "little")
    if size > reader.end - reader.pos:
        raise StateFileError(f"header length {size:,} runs past the end of the file")
    try:
        header = json.loads(reader.read(size))
        tree, specs = header["tree"], header["tensors"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateFileError(f"header is not the expected JSON ({shown(str(exc), 200)})") from None
    except RecursionError:
        raise StateFileError("header is nested deeper than Python can parse") from None
    if not isinstance(specs, list):
        raise StateFileError("header 'tensors' is not a list")
    blob_start, blob_len = reader.pos, reader.end - reader.pos
    layout = [_tensor_spec(spec, blob_len, i) for i, spec in enumerate(specs)]
    tensors, end = [], 0
    for i, (dtype, shape, offset, nbytes) in enumerate(layout):
        if offset < end:
            raise StateFileError(f"tensor {i}: offset {offset:,} overlaps the tensor before it (ends at {end:,})")
        end = offset + nbytes
        tensors.append(torch.empty(shape, dtype=dtype))
    for (_, _, offset, nbytes), tensor in zip(layout, tensors):
        reader.hash_to(blob_start + offset)
        if nbytes:
            reader.read_into(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return tree, tensors


def _tensor_spec(spec: Any, blob_len: int, index: int) -> tuple[torch.dtype, list[int], int, int]:
    """(dtype, shape, offset, nbytes) of a tensor's header entry, each checked against the
    others and the tensor bytes' length `blob_len`."""
    where = f"tensor {index}"
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "offset", "nbytes"}:
        raise StateFileError(f"{where}: expected dtype, shape, offset and nbytes, got {shown(spec, 200)}")
    dtype = DTYPES.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
    shape, offset, nbytes = spec["shape"], spec["offset"], spec["nbytes"]
    if dtype is None:
        raise StateFileError(f"{where}: dtype {shown(spec['dtype'], 60)}, expected one of {sorted(DTYPES)}")
    if not (isinstance(shape, list) and all(_count(n) for n in shape) and _count(offset) and _count(nbytes)):
        raise StateFileError(f"{where}: shape {shown(shape, 100)}, offset {shown(offset, 40)} and nbytes "
                             f"{shown(nbytes, 40)} must be non-negative integers")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if math.prod(shape) * itemsize != nbytes or offset + nbytes > blob_len:
        raise StateFileError(f"{where}: shape {shown(shape, 100)} of {spec['dtype']} is "
                             f"{math.prod(shape) * itemsize:,} bytes, recorded {nbytes:,} at offset {offset:,} "
                             f"of {blob_len:,}")
    return dtype, shape, offset, nbytes


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _decode(node: Any, tensors: list[torch.Tensor], where: str) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, tensors, f"{where}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, dict) and len(node) == 1:
        (tag, value), = node.items()
        if tag == "$tensor" and _count(value) and value < len(tensors):
            return tensors[value]
        if tag == "$tuple" and isinstance(value, list):
            return tuple(_decode(node["$tuple"], tensors, where))
        if tag == "$float" and value in ("nan", "inf", "-inf"):
            return float(value)
        if tag == "$dict" and isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
            out = {}
            for k, v in value:
                key = _decode(k, tensors, f"{where} key")
                if not isinstance(key, (str, int, float, bool, type(None), tuple)):
                    raise StateFileError(f"{where}: a key of type {type(key).__name__}")
                out[key] = _decode(v, tensors, f"{where}[{key!r}]")
            return out
    raise StateFileError(f"{where}: {json.dumps(node)[:100]} is not a value a state file holds")
