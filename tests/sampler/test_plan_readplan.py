"""Read planner: extents cover exactly the needed rows; the per-row baseline; window choice."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gnnssd.sampler.readplan import (CostModel, ReadPlan, Strategy, block_bytes, block_requests, choose_window, per_row_requests,
                                      plan_extents, read_stats, sorted_union)


def _row_pages(rows, row_bytes, page=4096):
    return {p for r in rows for p in range(r * row_bytes // page, ((r + 1) * row_bytes - 1) // page + 1)}


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.integers(0, 20000), min_size=1, max_size=300, unique=True),
    row_bytes=st.sampled_from([4, 96, 512, 1000, 4096, 6000]),
    request_us=st.floats(0.0, 100.0),
    max_request=st.sampled_from([4096, 16384, 1 << 20]),
)
# two rows sharing a page with a one-page request limit once made two extents start there
@example(rows=[304, 307], row_bytes=1000, request_us=0.0, max_request=4096)
def test_extents_cover_exactly_the_needed_rows(rows, row_bytes, request_us, max_request):
    rows = np.sort(np.array(rows, np.int64))
    model = CostModel(request_s=request_us * 1e-6, read_bw=1e9, write_bw=1e9, max_request=max_request)
    offsets, lengths, pages = plan_extents(rows, row_bytes, model)
    assert np.all(offsets % 4096 == 0) and np.all(lengths % 4096 == 0) and np.all(lengths > 0)
    overlap = np.maximum(offsets[:-1] + lengths[:-1] - offsets[1:], 0)
    assert np.all(offsets[1:] > offsets[:-1]) and np.all(overlap <= 4096)  # sorted, at most a shared page
    assert np.all(lengths <= model.max_extent(row_bytes))
    assert pages == len(_row_pages(rows, row_bytes))
    starts, ends = rows * row_bytes, (rows + 1) * row_bytes
    e = np.searchsorted(offsets, starts, "right") - 1
    assert np.all(e >= 0) and np.all(ends <= offsets[e] + lengths[e])  # each row inside one extent
    assert set(e.tolist()) == set(range(len(offsets)))  # no extent without a needed row
    runs = plan_extents(rows, row_bytes, model, merge=False)
    assert runs[2] == pages and runs[1].sum() == pages * 4096
    if model.max_request >= 1 << 20:
        assert len(offsets) <= len(runs[0])  # merging only removes requests
    if model.gap_pages == 0:  # without gap merging only touched pages are read
        assert lengths.sum() - overlap.sum() == pages * 4096


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(st.lists(st.integers(0, 5000), max_size=200, unique=True), max_size=6))
@example(runs=[[63, 64], [0, 127, 128], []])  # word edges
@example(runs=[])
def test_sorted_union_is_numpys_unique_of_the_runs(runs):
    arrays = [np.sort(np.array(r, np.int64)) for r in runs]
    expected = np.unique(np.concatenate(arrays)) if arrays else np.empty(0, np.int64)
    union = sorted_union(arrays)
    assert union.dtype == np.int64 and np.array_equal(union, expected)
    given = []  # into: the array it is written into (a packer's mapped file), of its count
    into = sorted_union(arrays, lambda count: given.append(np.full(count, -1, np.int64)) or given[-1])
    assert np.array_equal(into, expected) and (into is given[0] if given else not len(expected))


def test_contiguous_rows_respect_the_request_limit():
    """A dense run of rows that share pages is still cut at max_request (regression)."""
    model = CostModel(request_s=1e-5, read_bw=1e9, write_bw=1e9, max_request=1 << 20)
    rows = np.arange(3000, dtype=np.int64)
    offsets, lengths, pages = plan_extents(rows, 5732, model)
    assert np.all(lengths <= model.max_extent(5732)) and len(offsets) > 1
    assert pages == -(-3000 * 5732 // 4096)
    e = np.searchsorted(offsets, rows * 5732, "right") - 1
    assert np.all((rows + 1) * 5732 <= offsets[e] + lengths[e])


def test_per_row_requests_one_page_per_row():
    rows = np.array([0, 1, 7, 8, 100])
    off, ln = per_row_requests(rows, 512)
    assert np.array_equal(off, [0, 0, 0, 4096, 49152]) and np.all(ln == 4096)
    off, ln = per_row_requests(np.array([1]), 3000)  # a row straddling two pages
    assert off[0] == 0 and ln[0] == 8192


class _Plan:
    def __init__(self, rows, index):
        self.read_rows, self.num_read, self.epoch, self.index, self.read = rows, len(rows), 0, index, None


def test_window_choice_follows_the_model_and_the_disk_budget():
    rng = np.random.default_rng(0)
    plans = [_Plan(np.sort(rng.choice(1_000_000, 20_000, replace=False)), i) for i in range(4)]
    slow_requests = CostModel(request_s=50e-6, read_bw=1e9, write_bw=1e9)
    each = block_bytes(20_000, 512)
    scan = choose_window(plans, 512, slow_requests, disk_budget=2 * each)
    assert [p.read.strategy for p in plans].count("block") == 2  # the budget holds two blocks
    assert scan.lengths.sum() > 0
    for p in plans:
        st = read_stats(p, 512)
        assert st["useful_bytes"] == 20_000 * 512 and st["read_amplification"] == st["bytes_read"] / st["useful_bytes"]
        if p.read.strategy == "block":  # exactly the rows, padded to a page
            assert st["bytes_read"] == block_bytes(20_000, 512)
    free_requests = CostModel(request_s=0.0, read_bw=1e9, write_bw=1e9)
    for p in plans:  # page plans already made are reused: plan these afresh for the new model
        p.read = None
    scan = choose_window(plans, 512, free_requests, disk_budget=10 * each)
    assert all(p.read.strategy == "pages" for p in plans) and len(scan.lengths) == 0


def test_blocks_read_by_several_epochs_pay_for_a_scan_one_epoch_would_not():
    """One sparse mega-batch over a large file: its page reads save less than the scan of the
    file costs, once; read by four epochs (sampler.reuse_epochs) the saving is four times
    larger while the scan and the write happen once."""
    rng = np.random.default_rng(1)
    model = CostModel(request_s=20e-6, read_bw=1e9, write_bw=1e9)
    rows = np.sort(rng.choice(4_000_000, 20_000, replace=False))
    once = [_Plan(rows, 0)]
    assert len(choose_window(once, 512, model, disk_budget=1 << 30).lengths) == 0
    assert once[0].read.strategy is Strategy.PAGES
    pages_s = once[0].read.predicted_s
    reused = [_Plan(rows, 0)]
    scan = choose_window(reused, 512, model, disk_budget=1 << 30, uses=4)
    assert reused[0].read.strategy is Strategy.BLOCK and len(scan.lengths) > 0
    stored = ReadPlan.from_arrays(reused[0].read.to_arrays())  # as a spilled plan is loaded
    assert stored.strategy is Strategy.BLOCK and stored.equals(reused[0].read)
    with pytest.raises(ValueError, match="'blocks' is not a valid Strategy"):
        ReadPlan("blocks", stored.offsets, stored.lengths, 0, 0.0)
    # per use: the block read plus a quarter of the write and the scan, below the page reads
    nbytes = block_bytes(20_000, 512)
    expected = model.read_time(block_requests(nbytes, model)[1]) + (nbytes / 1e9 + model.read_time(scan.lengths)) / 4
    assert reused[0].read.predicted_s == pytest.approx(expected) and expected < pages_s


def test_dense_rows_read_through_shared_page_extents(tmp_path):
    """Rows of 5732 B, all of them: extents cut at the request limit share pages, and the
    hot cache's read still returns every row intact (regression)."""
    from gnnssd.pipeline import DirectIO, FeatureFile, HotCache

    rows, dim = 3000, 1433
    feats = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    path = tmp_path / "features.bin"
    data = feats.tobytes()
    path.write_bytes(data + bytes(-len(data) % 4096))
    io = DirectIO(queue_depth=8)
    model = CostModel(request_s=1e-5, read_bw=1e9, write_bw=1e9)
    source = FeatureFile(io, path, dim, np.float32, model, staging_bytes=4 << 20)
    np.testing.assert_array_equal(HotCache(source, np.arange(rows), rows).data, feats)
    source.close()
    io.shutdown()
