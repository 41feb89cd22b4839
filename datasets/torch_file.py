"""The one reader of torch-saved (.pt) dataset files (MAG240M's meta.pt and split_dict.pt,
OGB-link splits, GraphBolt torch-format arrays): nothing a file names can run.

torch 2.2.1's `torch.load` cannot be trusted with a hostile file: its legacy reader
unpickles without restriction, and `weights_only=True` has published bypasses
(CVE-2025-32434). This reader takes only torch's zip format apart itself: data.pkl goes
through an unpickler whose globals are its own functions (tensors are rebuilt here, from
the archive's stored bytes, as NumPy arrays with every offset and stride bounds-checked),
plain containers and NumPy arrays of numbers; anything else is refused naming the file.
"""
from __future__ import annotations

import collections
import io
import math
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from gnnssd.storage_format import DatasetError, shown

from .base import NUMPY_ARRAY_GLOBALS, bounded_numpy_global, require_file

STORAGES = {"DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
            "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
            "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_}
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra length
#: data.pkl decompressed: the object tree, and any NumPy arrays pickled in it (MAG240M's
#: split_dict.pt holds 11 MB of them); tensors' data are separate members, mapped, not read.
PICKLE_BYTES = 1 << 28
#: The small members read whole (byteorder: "little").
SMALL_MEMBER_BYTES = 64


class _StorageType:
    """What data.pkl's `torch.XStorage` global stands for here: the element dtype."""

    def __init__(self, dtype: type):
        self.dtype = np.dtype(dtype)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, path: Path, archive: zipfile.ZipFile, prefix: str):
        super().__init__(io.BytesIO(data))  # in memory: a length it names past its end is an error, not a read
        self.path, self.archive, self.prefix, self.limit = path, archive, prefix, len(data)

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return lambda data, requires_grad, hooks, *rest: data
        if module == "torch" and name in STORAGES:
            return _StorageType(STORAGES[name])
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) in NUMPY_ARRAY_GLOBALS:
            return bounded_numpy_global(self, module, name, self.limit)
        if (module, name) == ("_codecs", "encode"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name} (tensors, NumPy arrays of "
                                     "numbers and plain containers only)")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and isinstance(pid[4], int)):
            raise pickle.UnpicklingError(f"a storage reference {shown(pid, 100)}, expected ('storage', type, "
                                         "key, location, count)")
        _, kind, key, _, count = pid
        return _stored_array(self.path, self.archive, f"{self.prefix}data/{key}", kind.dtype, count)


def _stored_array(path: Path, archive: zipfile.ZipFile, member: str, dtype: np.dtype, count: int) -> np.ndarray:
    """The `count` elements of an uncompressed archive member, memory-mapped from the file."""
    try:
        info = archive.getinfo(member)
    except KeyError:
        raise pickle.UnpicklingError(f"no stored data {member!r} in the archive") from None
    if info.compress_type != zipfile.ZIP_STORED or count < 0 or info.file_size != count * dtype.itemsize:
        raise pickle.UnpicklingError(f"{member}: {info.file_size} bytes (compression {info.compress_type}), "
                                     f"expected {count} uncompressed {dtype} elements")
    if count == 0:
        return np.empty(0, dtype)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        signature, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if signature != b"PK\x03\x04":
        raise pickle.UnpicklingError(f"{member}: no local zip header at {info.header_offset}")
    offset = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> np.ndarray:
    """A tensor as a read-only view of its storage, refused when any element lies outside it."""
    if not (isinstance(storage, np.ndarray) and storage.ndim == 1 and _ints(offset) and isinstance(size, tuple)
            and isinstance(stride, tuple) and len(size) == len(stride) and all(_ints(v) for v in (*size, *stride))):
        raise pickle.UnpicklingError("a tensor whose storage, offset, size or stride is malformed")
    if any(n < 0 for n in (offset, *size, *stride)):
        raise pickle.UnpicklingError(f"a tensor with negative offset, size or stride {offset}, {shown(size, 80)}, "
                                     f"{shown(stride, 80)}")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if last >= len(storage) or offset > len(storage):
        raise pickle.UnpicklingError(f"a tensor of size {shown(size, 80)}, stride {shown(stride, 80)} at offset {offset} reaches "
                                     f"past its storage of {len(storage)} elements")
    if math.prod(size) > len(storage):
        # a stride-0 view of 2**40 elements over one: every copy of it (np.asarray(..., int64))
        # would allocate the whole view, 8 TiB from a 600-byte file
        raise pickle.UnpicklingError(f"a tensor of size {shown(size, 80)} (stride {shown(stride, 80)}) viewing a storage of "
                                     f"{len(storage)} elements: more elements than its storage holds "
                                     "(save it with .contiguous())")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=tuple(s * storage.itemsize for s in stride), writeable=False)
    return view


def _ints(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_values(value: Any, path: Path) -> None:
    """Numbers, strings, containers and numeric arrays only (no object arrays)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise DatasetError(f"{path}: holds an array of dtype {value.dtype}; expected numbers")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_values(k, path)
            _check_values(v, path)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_values(v, path)
    elif not (value is None or isinstance(value, (bool, int, float, str, bytes, np.generic))):
        raise DatasetError(f"{path}: holds a {type(value).__name__}; expected tensors, arrays and plain values")


def load_torch_file(path: Path) -> Any:
    """The content of a torch-saved file: tensors as read-only NumPy arrays (mapped from the
    file), NumPy arrays, dicts, lists and plain values; DatasetError naming the file for
    anything else, and for a file in torch's legacy format or a bare pickle, which are
    refused unread (they would be unpickled without restriction)."""
    path = require_file(Path(path))
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path}: not a zip-format torch file (a bare pickle, or torch's legacy "
                           "format from before torch 1.6); refused unread: reading it would unpickle "
                           "without restriction. Save it again with torch.save on torch >= 1.6")
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise DatasetError(f"{path}: a zip file, but not a torch file (no single NAME/data.pkl)")
            prefix = pickles[0][: -len("data.pkl")]
            if f"{prefix}byteorder" in archive.namelist() and _member(
                    archive, f"{prefix}byteorder", SMALL_MEMBER_BYTES, path) != b"little":
                raise DatasetError(f"{path}: saved on a big-endian machine; expected little-endian data")
            value = _Unpickler(_member(archive, pickles[0], PICKLE_BYTES, path), path, archive, prefix).load()
        _check_values(value, path)
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, struct.error) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"{path}: holds more than tensors and arrays, refused unread ({exc})") from None
    except MemoryError:
        raise DatasetError(f"{path}: its contents need more memory than this machine has; a torch file "
                           "of tensors and arrays needs little beyond their stored bytes") from None
    except RecursionError:
        raise DatasetError(f"{path}: its values are nested deeper than Python can follow; expected tensors, "
                           "arrays and plain containers") from None
    return value


def _member(archive: zipfile.ZipFile, name: str, limit: int, path: Path) -> bytes:
    """The archive member `name`, read whole only when its size (as the archive records it,
    which also bounds what decompression may produce) is at most `limit` bytes: a DEFLATE
    member of 1 GiB in 1 MiB is refused, not inflated."""
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise DatasetError(f"{path}: its member {name} is {info.file_size:,} bytes uncompressed, more than "
                           f"the {limit:,} a torch file's {name.rsplit('/', 1)[-1]} may hold")
    return archive.read(info)
