"""Compact-block writer and row copies: files and buffers against NumPy slicing."""
import os

import numpy as np
import pytest

from gnnssd.io_engine.engine import alloc
from gnnssd.pipeline.block_writer import BlockWriter, row_lists
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


def test_blocks_given_their_row_counts_are_allocated_at_their_final_size_when_opened(tmp_path):
    """With each block's row count the files have their final size (and disk space) before
    a row is written, and hold the same bytes as files that grew as they were written."""
    rng = np.random.default_rng(7)
    staging = alloc(1 << 20)
    staging[:] = rng.integers(0, 256, len(staging), dtype=np.uint8)
    positions = [np.sort(rng.choice(2000, n, replace=False)) * 512 for n in (0, 1, 9, 700)]
    sizes = [-(-len(pos) * 512 // 4096) * 4096 for pos in positions]
    grown, allocated = tmp_path / "grown", tmp_path / "allocated"
    for folder, rows in ((grown, None), (allocated, [len(pos) for pos in positions])):
        folder.mkdir()
        paths = [folder / f"b{k}.bin" for k in range(len(positions))]
        with BlockWriter(paths, 512, alloc, max_chunk=8192, rows=rows) as writer:
            if rows is not None:
                assert [p.stat().st_size for p in paths] == sizes
                assert all(p.stat().st_blocks * 512 >= size for p, size in zip(paths, sizes))
            for k, pos in enumerate(positions):
                writer.append(k, staging, pos)
        assert writer.bytes_written == sum(sizes)
    for k in range(len(positions)):
        assert (allocated / f"b{k}.bin").read_bytes() == (grown / f"b{k}.bin").read_bytes()
        assert (grown / f"b{k}.bin").stat().st_size == sizes[k]


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


def _scan_into_blocks(tmp_path, row_bytes, blocks, scan_chunk_rows, max_chunk, num_rows=3000, missing=None,
                     in_place=False):
    """What the repack scan does: the union of the blocks' rows, in order, chunk by chunk
    through a staging area in shuffled places, each chunk's rows appended to every block
    with append_sorted; returns the files and what NumPy says they should hold. With
    `in_place`, the blocks' lists are views of one array, laid in it in reverse order (as a
    packer window's mapped rows: row_lists takes them where they lie)."""
    rng = np.random.default_rng(row_bytes + len(blocks))
    table = rng.integers(0, 256, (num_rows, row_bytes), dtype=np.uint8)  # row r's bytes
    union = np.unique(np.concatenate([np.empty(0, np.int64), *blocks]))
    if missing is not None:
        union = union[union != missing]
    paths = [tmp_path / f"b{k}.bin" for k in range(len(blocks))]
    staging = alloc(scan_chunk_rows * row_bytes)
    lists = [np.asarray(b, np.int64) for b in blocks]
    within = None
    if in_place:
        within = np.concatenate(lists[::-1] or [np.empty(0, np.int64)])
        at = np.cumsum([0] + [len(b) for b in lists[::-1]])[:-1][::-1]
        lists = [within[a : a + len(b)] for a, b in zip(at, lists)]
    rows, starts, ends = row_lists(lists, within)
    assert (rows is within) == in_place
    cursor = np.zeros(len(blocks), np.int64)
    with BlockWriter(paths, row_bytes, alloc, max_chunk=max_chunk) as writer:
        for lo in range(0, len(union), scan_chunk_rows):
            chunk = union[lo:lo + scan_chunk_rows]
            pos = rng.permutation(scan_chunk_rows)[: len(chunk)] * row_bytes  # places in staging
            for r, p in zip(chunk, pos):
                staging[p:p + row_bytes] = table[r]
            writer.append_sorted(staging, chunk, pos, rows, starts, ends, cursor, int(chunk[-1]))
    return paths, [table[b].tobytes() for b in blocks]


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("row_bytes", [6, 96, 512, 5000])
def test_scan_chunks_appended_to_every_block_in_one_call_hold_their_rows(tmp_path, row_bytes, in_place):
    """append_sorted (the repack's one kernel call per scan chunk) against NumPy: blocks
    overlapping, disjoint, inside one scan chunk, spanning many, empty, and rows straddling
    one-page chunks; every file holds its rows in order, zero-padded to a page."""
    rng = np.random.default_rng(7)
    blocks = [np.sort(rng.choice(3000, 400, replace=False)),  # spread over the whole scan
              np.arange(100, 160),  # a run inside a few scan chunks
              np.empty(0, np.int64),  # a block with no rows
              np.array([2999]),  # only the scan's last row
              np.sort(rng.choice(np.arange(1500, 3000), 700, replace=False))]
    paths, want = _scan_into_blocks(tmp_path, row_bytes, blocks, scan_chunk_rows=37, max_chunk=4096,
                                    in_place=in_place)
    for path, expected in zip(paths, want):
        data = path.read_bytes()
        assert len(data) == -(-len(expected) // 4096) * 4096
        assert data[: len(expected)] == expected and not any(data[len(expected):])


def test_a_block_ending_where_its_chunk_fills_then_gets_more_rows(tmp_path):
    """128-byte rows: 32 fill a one-page chunk exactly. A block's rows ending a call exactly
    at its chunk's end, the next call's rows go to a fresh chunk (none skipped)."""
    staging = alloc(1 << 16)
    staging[:] = np.random.default_rng(3).integers(0, 256, len(staging), dtype=np.uint8)
    pos = np.arange(0, 64 * 128, 128)
    with BlockWriter([tmp_path / "b.bin"], 128, alloc, max_chunk=4096) as writer:
        writer.append(0, staging, pos[:32])  # exactly one chunk
        writer.append(0, staging, pos[32:40])
    assert (tmp_path / "b.bin").read_bytes()[: 40 * 128] == staging[: 40 * 128].tobytes()


def test_a_block_row_the_scan_did_not_read_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="row 50 of block 0 is not among the rows read"):
        _scan_into_blocks(tmp_path, 64, [np.arange(40, 60)], scan_chunk_rows=8, max_chunk=4096, missing=50)


def test_rows_outside_the_source_are_refused(tmp_path):
    with BlockWriter([tmp_path / "b.bin"], 64, alloc) as writer, pytest.raises(ValueError, match="outside"):
        writer.append(0, alloc(4096), np.array([0, 4096 - 32]))


def test_row_lists_takes_views_of_one_array_where_they_lie_and_copies_anything_else():
    """A packer window's read rows are views of its mapped rows file: taken in place (no
    copy of a window's rows), in any order; a list that is not a contiguous run of that
    array (a copy, a strided view) makes them all one concatenated array, as without it."""
    within = np.arange(100, dtype=np.int64)
    lists = [within[60:70], within[0:5], within[5:5], within[90:100]]
    rows, starts, ends = row_lists(lists, within)
    assert rows is within
    assert [rows[a:b].tolist() for a, b in zip(starts, ends)] == [x.tolist() for x in lists]
    for odd in (within[10:20].copy(), within[10:30:2], within[10:20].astype(np.int32)):
        rows, starts, ends = row_lists([within[60:70], odd], within)
        assert not np.shares_memory(rows, within)
        assert [rows[a:b].tolist() for a, b in zip(starts, ends)] == [list(range(60, 70)), odd.tolist()]
