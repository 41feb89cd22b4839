"""The planner's union of input rows (a hash table sized by the union, or a place a row when
that is no larger) against NumPy, and what it holds: nothing sized by the graph's rows."""
import numpy as np
import pytest

from gnnssd.sampler.blocks import MFGs
from gnnssd.sampler.graphs import random_csc
from gnnssd.sampler.plan import HotRows, PlanConfig, Planner, RowUnion
from gnnssd.sampler.seed_order import Shuffled, seed_batches

NO_LIMIT = 1 << 62


def _inputs(rows) -> MFGs:
    """A one-layer mini-batch whose input rows are `rows` (no edges)."""
    rows = np.asarray(rows, np.int64)
    none = np.empty(0, np.int32)
    return MFGs(nodes=rows, num_src=np.array([len(rows)]), num_dst=np.array([0]), edge_ptr=np.array([0, 0]),
                edge_src=none, edge_dst=none)


def _check_plan(plan, batches: list[np.ndarray], hot: np.ndarray, prev: np.ndarray | None) -> None:
    """The plan of `batches` against NumPy: its buffer rows are the cold rows of the union
    (read ones, then carried ones, each ascending), and each gather index picks exactly a
    mini-batch's input rows out of [hot rows | buffer rows]."""
    inputs = np.concatenate(batches) if batches else np.empty(0, np.int64)
    cold = np.setdiff1d(inputs, hot)
    np.testing.assert_array_equal(np.sort(plan.rows), cold)
    read, carried = plan.rows[: plan.num_read], plan.rows[plan.num_read:]
    assert np.all(np.diff(read) > 0) and np.all(np.diff(carried) > 0)
    np.testing.assert_array_equal(carried, np.intersect1d(cold, prev if prev is not None else []))
    if prev is not None:
        np.testing.assert_array_equal(prev[plan.carry_src], carried)
    table = np.concatenate([hot, plan.rows])
    assert len(plan.gather) == len(batches)
    for rows, index in zip(batches, plan.gather):
        np.testing.assert_array_equal(table[index], rows)
    assert plan.stats["unique_rows"] == len(np.unique(inputs))
    assert plan.stats["input_rows"] == len(inputs)
    assert plan.stats["hot_hits"] == int(np.isin(inputs, hot).sum())


# 3,000 rows: the union's table grows into a place a row (its hash table would be as large);
# 10^6 rows: it stays a hash table sized by the union
@pytest.mark.parametrize("num_rows", [3_000, 1_000_000])
@pytest.mark.parametrize("shape", ["empty", "all rows", "duplicates", "random"])
def test_union_plans_match_numpy(num_rows, shape):
    rng = np.random.default_rng(hash((num_rows, shape)) % 2**32)
    hot = np.sort(rng.choice(num_rows, num_rows // 10, replace=False))
    if shape == "empty":
        batches = [np.empty(0, np.int64), np.empty(0, np.int64)]
    elif shape == "all rows":  # every row, in shuffled mini-batches that together cover the graph
        batches = np.array_split(rng.permutation(num_rows), 3)
    elif shape == "duplicates":  # rows repeated across mini-batches and within one
        pool = rng.choice(num_rows, 500, replace=False)
        batches = [pool[rng.integers(0, 500, 800)] for _ in range(4)]
    else:
        batches = [rng.choice(num_rows, 1_000, replace=False) for _ in range(5)]
    union = RowUnion(num_rows, HotRows.of(hot, num_rows))
    prev = None
    for epoch in range(2):  # a second group carries rows from the first one's buffer
        for rows in batches:
            assert union.add(_inputs(rows), NO_LIMIT)
        plan = union.take(prev, 0 if prev is None else len(prev), epoch, 0)
        _check_plan(plan, batches, hot, prev)
        prev = plan.rows
        batches = [rng.permutation(b) for b in batches]
    if num_rows == 1_000_000:  # a small union never gets a place a row, the whole graph does
        assert (len(union.table) == num_rows) == (shape == "all rows")


@pytest.mark.parametrize("num_rows", [3_000, 1_000_000])
def test_a_refused_minibatch_leaves_the_union_as_it_was(num_rows):
    """Past the cold-row limit, the rows a mini-batch put in the table are taken out again:
    the plan equals that of the union without it (the table empty of them, probe runs intact)."""
    rng = np.random.default_rng(5)
    hot = np.sort(rng.choice(num_rows, 300, replace=False))
    first = [rng.choice(num_rows, 900, replace=False) for _ in range(3)]
    refused = rng.choice(num_rows, 2_000, replace=False)
    union, reference = (RowUnion(num_rows, HotRows.of(hot, num_rows)) for _ in range(2))
    for rows in first:
        assert union.add(_inputs(rows), NO_LIMIT) and reference.add(_inputs(rows), NO_LIMIT)
    limit = union.cold_rows() + 10
    assert not union.add(_inputs(refused), limit)
    assert union.cold_rows() == reference.cold_rows()
    plan = union.take(None, 0, 0, 0)
    assert plan.equals(reference.take(None, 0, 0, 0))
    _check_plan(plan, first, hot, None)
    assert (union.table < 0).all()  # emptied for the next group
    assert union.add(_inputs(refused), NO_LIMIT)  # and usable again
    _check_plan(union.take(None, 0, 0, 1), [refused], hot, None)


def test_the_planner_holds_no_array_sized_by_the_graph():
    """After planning small mini-batches of a graph of 10^6 rows, nothing the planner holds
    (beyond the topology it was given and the hot cache's bitset, a bit a row) has an
    entry a row: the union's table is sized by the union (a slot a row was 4 MB here, and
    0.42 GiB at papers' 10^8 rows)."""
    num_rows = 1_000_000
    indptr, indices = random_csc(num_rows, 3, seed=2)
    hot = HotRows.of(np.arange(0, num_rows, 97), num_rows)
    planner = Planner(indptr, indices, PlanConfig(fanouts=(4, 3), mega_batch=4, seed=1), hot, max_rows=1_500)
    train = np.random.default_rng(0).choice(num_rows, 4_000, replace=False)
    plans = [plan for epoch, size in enumerate((64, 512))  # mega-batches, then mini-batches in pieces
             for plan in planner.plan_batches(seed_batches(train, size, Shuffled(), 1, epoch), epoch)]
    assert any(p.pieces for p in plans) and any(len(p.minibatches) > 1 for p in plans)

    given = {id(a) for a in (indptr, indices, planner.sampler.indptr, planner.sampler.indices, hot.bits, hot.rows)}
    held = []
    for owner in (planner, planner.union, planner.sampler):
        for name, value in vars(owner).items():
            for array in value if isinstance(value, tuple) else (value,):
                if isinstance(array, np.ndarray) and id(array) not in given:
                    held.append((type(owner).__name__, name, len(array)))
    assert held, "the walk found the planner's arrays"
    assert all(length < num_rows // 16 for _, _, length in held), held
