"""The per-mini-batch CPU kernels of the ssd data path against NumPy references: the plan's
union (hashed, then put in row order), piece plans, the gather into x (pieces fill only their rows), and the recycled x memory."""
import numpy as np
import pytest
import torch

from gnnssd.io_engine import gather_rows
from gnnssd.pipeline.buffers import Recycler, _gather_widened
from gnnssd.pipeline.hot_cache import COLD, HOST, NO_ROWS
from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.plan import PlanConfig, Planner
from gnnssd.sampler.seed_order import Shuffled, seed_batches

N = 5000


@pytest.fixture(scope="module")
def graph():
    indptr, indices = random_csc(N, 6, seed=11, communities=10)
    train = np.random.default_rng(1).choice(N, 1500, replace=False)
    hot = np.random.default_rng(2).choice(N, 400, replace=False)  # scattered, not a prefix
    return indptr, indices, train, hot


def _plans(graph, max_rows: int | None) -> list:
    """One epoch's plans."""
    indptr, indices, train, hot = graph
    config = PlanConfig(fanouts=(4, 3), mega_batch=4, seed=5)
    return list(Planner(indptr, indices, config, hot, max_rows=max_rows).plan_batches(seed_batches(train, 100, Shuffled(), 5, 0), 0))


@pytest.mark.parametrize("max_rows", [None, 700])  # 700: mega-batches cut, some mini-batches in pieces
def test_plans_match_a_numpy_reference(graph, max_rows):
    walked = _plans(graph, max_rows)
    if max_rows:
        assert any(p.pieces for p in walked) and any(not p.pieces for p in walked)
    hot = np.unique(graph[3])
    previous = None
    for plan in walked:
        read, carried = plan.rows[: plan.num_read], plan.rows[plan.num_read:]
        assert np.all(np.diff(read) > 0) and np.all(np.diff(carried) > 0)  # each run ascending
        assert not np.isin(plan.rows, hot).any()
        if len(carried):
            np.testing.assert_array_equal(previous[plan.carry_src], carried)
        # store row of every slot of [hot cache | buffer]: the gather must give the input rows
        table = np.concatenate([hot, plan.rows])
        if plan.pieces:
            # a piece lists only the rows it supplies: its positions in x, their slots
            np.testing.assert_array_equal(table[plan.gather[0]], plan.minibatches[0].input_nodes[plan.positions])
            assert len(plan.positions) == len(plan.gather[0]) == len(set(plan.positions.tolist()))
            want = np.setdiff1d(plan.minibatches[0].input_nodes, hot)
            k, size = plan.piece, max_rows
            np.testing.assert_array_equal(plan.rows, want[k * size:(k + 1) * size])
        else:
            for mfgs, index in zip(plan.minibatches, plan.gather):
                np.testing.assert_array_equal(table[index], mfgs.input_nodes)
            inputs = np.concatenate([m.input_nodes for m in plan.minibatches])
            np.testing.assert_array_equal(np.sort(plan.rows), np.setdiff1d(inputs, hot))
        previous = plan.rows


def _levels(index: np.ndarray, num_hot: int) -> tuple[np.ndarray, np.ndarray]:
    """A gather index over [hot | buffer] as RowPlaces' (level, slot): the host cache or the buffer."""
    hot = index < num_hot
    return np.where(hot, HOST, COLD).astype(np.int8), np.where(hot, index, index - num_hot).astype(np.int64)


@pytest.mark.parametrize("row_bytes", [32, 12])
def test_gather_kernel_matches_numpy_and_leaves_unsupplied_rows(row_bytes):
    rng = np.random.default_rng(0)
    hot = rng.integers(0, 255, (50, row_bytes), dtype=np.uint8)
    buffer = rng.integers(0, 255, (70, row_bytes), dtype=np.uint8)
    table = np.concatenate([hot, buffer])
    index = rng.integers(0, 120, 1000)
    out = np.full((1000, row_bytes), 7, np.uint8)  # a whole plan: every row, in order
    gather_rows((hot[:0], hot, buffer), *_levels(index, len(hot)), NO_ROWS, out)
    np.testing.assert_array_equal(out, table[index])
    positions = rng.permutation(1000)[:700]  # a piece: its rows only, the rest another piece's
    out = np.full((1000, row_bytes), 7, np.uint8)
    gather_rows((hot[:0], hot, buffer), *_levels(index[:700], len(hot)), positions, out)
    want = np.full_like(out, 7)
    want[positions] = table[index[:700]]
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_large_gather_streams_on_several_threads_and_matches_numpy(threads):
    """An x past GIO_GATHER_STREAM_BYTES (written with streaming stores), split between
    threads, from three levels, whole and as a piece: NumPy's rows; an index out of range is
    refused naming it, before anything is copied."""
    rng = np.random.default_rng(4)
    levels = [rng.integers(0, 1 << 62, (rows, 80), dtype=np.int64) for rows in (300, 5000, 9000)]  # 640 B rows
    n = 20_000  # 12.8 MB
    level = rng.integers(0, 3, n).astype(np.int8)
    slot = (rng.random(n) * np.array([len(a) for a in levels])[level]).astype(np.int64)
    want = np.stack([levels[lv][s] for lv, s in zip(level, slot)])
    out = np.zeros((n, 80), np.int64)
    gather_rows(levels, level, slot, NO_ROWS, out, threads)
    np.testing.assert_array_equal(out, want)
    positions = rng.permutation(n)[: n // 2]
    out[:] = 5
    gather_rows(levels, level[: n // 2], slot[: n // 2], positions, out, threads)
    np.testing.assert_array_equal(out[positions], want[: n // 2])
    assert np.count_nonzero(out != 5) == np.count_nonzero(want[: n // 2] != 5)  # no other row touched
    slot[n - 1] = len(levels[level[n - 1]])
    out[:] = 5
    with pytest.raises(ValueError, match=f"row {n - 1} of the gather is out of range: level {level[n - 1]} of 3, "
                                         f"slot {slot[n - 1]} of {slot[n - 1]} rows"):
        gather_rows(levels, level, slot, NO_ROWS, out, threads)
    assert np.all(out == 5)


def test_gather_widens_every_float16_exactly_as_numpy_does():
    """float16 rows are gathered straight into the model's float32 x: all 65,536 bit
    patterns (subnormals, infinities, NaNs included) against NumPy's conversion, bit for bit."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(-1, 64)
    hot, buffer = halves[:600], halves[600:]
    index = np.arange(len(halves))[::-1].copy()
    mine = np.arange(len(index)) % 7 > 0  # rows another piece supplies: left as they are
    out = np.full((len(index), 64), 3.0, np.float32)
    _gather_widened(hot[:0].view(np.uint16), hot.view(np.uint16), buffer.view(np.uint16),
                    *_levels(index[mine], len(hot)), np.flatnonzero(mine), out.view(np.uint32))
    want = np.full_like(out, 3.0)
    want[mine] = halves[index[mine]].astype(np.float32)
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_recycler_reuses_an_x_only_once_nothing_references_it():
    recycler = Recycler(keep=2)
    a = recycler.take(100, 4, np.float32)
    held = torch.from_numpy(a[10:20])  # a tensor of a slice keeps a's memory in use
    del a
    b = recycler.take(100, 4, np.float32)  # a in use: new memory, kept (two kept now)
    c = recycler.take(90, 4, np.float32)  # both kept arrays in use: new memory, not kept
    assert not np.shares_memory(b, held.numpy()) and not np.shares_memory(c, held.numpy())
    assert not np.shares_memory(b, c) and len(recycler._arrays) == 2
    del held, c
    d = recycler.take(100, 4, np.float32)  # a's memory again
    assert d.shape == (100, 4) and d.dtype == np.float32 and np.shares_memory(d, recycler._arrays[0])
    e = recycler.take(2000, 4, np.float32)  # both in use (b, d)
    assert not any(np.shares_memory(e, kept) for kept in recycler._arrays)
    del d
    f = recycler.take(3000, 4, np.float32)  # the free kept array is too small: replaced
    assert np.shares_memory(f, recycler._arrays[0]) and recycler._arrays[0].nbytes >= f.nbytes
    assert not np.shares_memory(f, b)
    del f
    g = recycler.take(1600, 4, np.float32)  # over half the free array's size: reused
    assert np.shares_memory(g, recycler._arrays[0])
    del g
    h = recycler.take(1000, 4, np.float32)  # under half (training after an evaluation): replaced, smaller
    assert np.shares_memory(h, recycler._arrays[0]) and recycler._arrays[0].nbytes == h.nbytes + h.nbytes // 8
