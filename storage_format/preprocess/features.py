"""features.bin: the source's rows checked and streamed in chunks (each recorded once on
disk, so an interrupted run resumes after the last), and int8 rows quantized from them."""
from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..atomic import ChecksummedWriter, writable_file
from .disk_space import _writing
from ..errors import DatasetError
from .input_checks import _checked_chunk
from ..manifest import FEATURES, PAGE, ROW_SCALES
from .progress import record, state_of
from ..quantize import quantize_rows
from .source import DatasetSource, schema_of

QUANTIZED_FEATURES = "features.int8.bin"  # int8 rows until they replace the float32 features.bin
CHUNK_BYTES = 16 << 20


def _chunk_rows(row_bytes: int) -> int:
    return max(1, CHUNK_BYTES // max(row_bytes, 1))


def _window_rows(spare: int, row_bytes: int) -> int:
    """Rows of one window of the out-of-core feature reorder: half the memory to spare
    (the window, and the rows read into it), at most 4 GiB."""
    return max(_chunk_rows(row_bytes), min(spare // 2, 4 << 30) // max(row_bytes, 1))


def _written_dtype(dtype: str) -> str:
    """The dtype features.bin is first written in: int8 rows are quantized from float32."""
    return "float32" if dtype == "int8" else dtype


def _open_resumable(partial: Path, name: str) -> tuple[ChecksummedWriter, int]:
    """Open `name` for appending at the last durable chunk recorded for it."""
    state = state_of(partial, name)
    f = writable_file(partial / name, partial, state["size"])
    return ChecksummedWriter(f, state["crc32"], state["size"]), state["rows"]


def _finish_features(partial: Path, name: str, writer: ChecksummedWriter, rows: int) -> dict[str, int]:
    pad = -writer.size % PAGE
    writer.write(bytes(pad))
    writer.sync()
    writer.file.close()
    meta = {"size": writer.size, "crc32": writer.crc}
    record(partial, name, {"rows": rows, **meta, "done": 1})
    return meta


def _write_rows_resumably(partial: Path, name: str, blocks_from: Callable[[int], Iterator[np.ndarray]],
                          n: int, stage: str, notify: Callable[[str, int, int], None]) -> dict[str, int]:
    """Append the row blocks `blocks_from(first_row)` yields to `name`, recording each
    block once it is on disk, so an interrupted run resumes after the last one."""
    state = state_of(partial, name)
    if state["done"]:
        return {"size": state["size"], "crc32": state["crc32"]}
    with _writing(partial / name, "feature rows"):
        writer, row = _open_resumable(partial, name)
        try:
            for block in blocks_from(row):
                writer.write(block.data)
                row += len(block)
                writer.sync()
                record(partial, name, {"rows": row, "size": writer.size,
                                                 "crc32": writer.crc, "done": 0})
                notify(stage, row, n)
        except BaseException:
            # close now, not in a finalizer that would print a flush error on a full disk;
            # what did not reach the disk is not in the progress record either
            with suppress(OSError):
                writer.file.close()
            raise
        return _finish_features(partial, name, writer, row)


def _checked_feature_rows(source: DatasetSource, dtype: str) -> Callable[[int], Iterator[np.ndarray]]:
    """rows_from(first_row): the source's feature rows from `first_row` on, checked and
    converted to `dtype`, CHUNK_BYTES at a time."""
    n = schema_of(source).feature_rows
    chunk_rows = _chunk_rows(source.feat_dim * np.dtype(dtype).itemsize)

    def rows_from(row: int) -> Iterator[np.ndarray]:
        for chunk in source.feature_chunks(row, chunk_rows):
            if row + len(chunk) > n:
                raise DatasetError(f"{source.name}: more feature rows than the {n} nodes with features")
            yield _checked_chunk(source, np.asarray(chunk), row, dtype)
            row += len(chunk)
        if row != n:
            raise DatasetError(f"{source.name}: {row} feature rows for {n} nodes with features")

    return rows_from


def _stream_features(partial: Path, name: str, source: DatasetSource, dtype: str,
                     notify: Callable[[str, int, int], None]) -> dict[str, int]:
    return _write_rows_resumably(partial, name, _checked_feature_rows(source, dtype),
                                 schema_of(source).feature_rows, "features", notify)


def _quantize_features(partial: Path, n: int, dim: int,
                       notify: Callable[[str, int, int], None]) -> dict[str, dict[str, int]]:
    """Quantize the float32 features.bin (store order) into int8 rows and features.scale
    (`quantize_rows`) in one sequential pass, then replace features.bin with the int8 rows.
    A resumed run redoes the pass until it is recorded done; the replacement is a rename,
    repeated if the run stopped between the record and the rename."""
    state = {name: state_of(partial, name) for name in (QUANTIZED_FEATURES, ROW_SCALES)}
    if not state[ROW_SCALES]["done"]:
        chunk_rows = _chunk_rows(dim * 4)
        with (_writing(partial / QUANTIZED_FEATURES, "int8 feature rows"),
              open(partial / FEATURES, "rb") as src, writable_file(partial / QUANTIZED_FEATURES, partial) as codes_file,
              writable_file(partial / ROW_SCALES, partial) as scales_file):
            codes_out, scales_out = ChecksummedWriter(codes_file), ChecksummedWriter(scales_file)
            for lo in range(0, n, chunk_rows):
                rows = min(chunk_rows, n - lo)
                codes, params = quantize_rows(np.frombuffer(src.read(rows * dim * 4), "<f4").reshape(rows, dim))
                codes_out.write(codes.data)
                scales_out.write(params.astype("<f4").data)
                notify("quantize", lo + rows, n)
            codes_out.write(bytes(-codes_out.size % PAGE))
            codes_out.sync()
            scales_out.sync()
        for name, out in ((QUANTIZED_FEATURES, codes_out), (ROW_SCALES, scales_out)):
            state[name] = {"rows": n, "size": out.size, "crc32": out.crc, "done": 1}
            record(partial, name, state[name])
    if (partial / QUANTIZED_FEATURES).exists():
        os.replace(partial / QUANTIZED_FEATURES, partial / FEATURES)
    return {FEATURES: {"size": state[QUANTIZED_FEATURES]["size"], "crc32": state[QUANTIZED_FEATURES]["crc32"]},
            ROW_SCALES: {"size": state[ROW_SCALES]["size"], "crc32": state[ROW_SCALES]["crc32"]}}
