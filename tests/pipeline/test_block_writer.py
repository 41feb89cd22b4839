"""Compact-block writer and row copies: files and buffers against NumPy slicing."""
import os

import numpy as np
import pytest

from gnnssd.io_engine.engine import alloc
from gnnssd.pipeline.block_writer import BlockWriter
from gnnssd.io_engine.rows import copy_rows


@pytest.mark.parametrize("row_bytes", [6, 96, 512, 5000])
def test_blocks_hold_the_appended_rows_padded_to_a_page(tmp_path, row_bytes):
    rng = np.random.default_rng(row_bytes)
    staging = alloc(1 << 20)
    staging[:] = rng.integers(0, 256, len(staging), dtype=np.uint8)
    slots = len(staging) // row_bytes
    paths = [tmp_path / f"b{k}.bin" for k in range(3)]
    expected = [bytearray() for _ in paths]
    # one-page chunks: rows straddle chunk ends and chunks go to the writers many times
    with BlockWriter(paths, row_bytes, alloc, max_chunk=4096) as writer:
        for _ in range(40):
            k = int(rng.integers(len(paths)))
            pos = rng.choice(slots, int(rng.integers(0, 60)), replace=False) * row_bytes
            writer.append(k, staging, pos)
            for p in pos:
                expected[k] += staging[p : p + row_bytes].tobytes()
    for path, want in zip(paths, expected):
        data = path.read_bytes()
        assert len(data) == -(-len(want) // 4096) * 4096
        assert data[: len(want)] == bytes(want) and not any(data[len(want):])
    assert writer.bytes_written == sum(p.stat().st_size for p in paths)


def test_unwritable_block_is_an_error_and_leaves_no_file_open(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        BlockWriter([tmp_path / "ok.bin", tmp_path / "missing" / "b.bin"], 512, alloc)
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("row_bytes, aligned", [(512, True), (512, False), (12, True)])
def test_copy_rows_matches_slicing(row_bytes, aligned):
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    step = 8 if aligned else 1
    pos = rng.choice((len(src) - row_bytes) // step, 300, replace=False) * step
    out = np.empty((len(pos), row_bytes), np.uint8)
    copy_rows(src, pos, row_bytes, out)
    assert np.array_equal(out, np.stack([src[p : p + row_bytes] for p in pos]))
