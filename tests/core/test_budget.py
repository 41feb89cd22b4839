"""Sizes parse as documented; the budget split follows its policy and refusals say what fits."""
from __future__ import annotations

import os

import pytest

from gnnssd.core.budget import (MIN_BUFFER_BYTES, MINIBATCH_MARGIN, PACKED_FEATURE_SHARE, MemoryBudget,
                                auto_block_budget, format_bytes, parse_bytes, resolve_block_budget, ssd_split)

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize("text, expected", [
    ("1.25GiB", 1.25 * GiB), ("512MiB", 512 * MiB), ("2GB", 2 * 10**9), ("2 gb", 2 * 10**9),
    ("100", 100), ("7B", 7), ("0.5KiB", 512), (".5MiB", MiB // 2), (4096, 4096), (0, 0),
])
def test_parse_bytes(text: str | int, expected: float) -> None:
    assert parse_bytes(text) == int(expected)


@pytest.mark.parametrize("bad", ["", "GiB", "1.2.3GiB", "2 GiB/s", "12 parsecs", "-1GiB", -5, True, 1.5])
def test_parse_bytes_refuses_with_accepted_forms(bad: object) -> None:
    with pytest.raises(ValueError) as err:
        parse_bytes(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(err.value) and "GiB" in str(err.value)


def test_format_bytes() -> None:
    assert format_bytes(1.25 * GiB) == "1.25 GiB"
    assert format_bytes(300) == "300 B"


def test_split_gives_buffers_and_queues_first_then_hot_cache() -> None:
    b = MemoryBudget.split(GiB, row_bytes=512, hot_rows=10**7, buffer_rows=100_000,
                           buffers=3, queue_bytes=64 * MiB)
    assert b.buffers == 3 and b.buffer_bytes == 3 * 100_000 * 512
    assert b.queue_bytes == 64 * MiB
    assert b.hot_rows == (GiB - b.buffer_bytes - 64 * MiB) // 512 < 10**7
    assert 0 <= b.spare_bytes < 512
    assert b.hot_bytes + b.buffer_bytes + b.queue_bytes + b.spare_bytes == GiB
    assert "of 10,000,000 wanted" in b.describe()


def test_split_leaves_spare_when_hot_cache_wants_less() -> None:
    b = MemoryBudget.split(GiB, row_bytes=512, hot_rows=1000, buffer_rows=1000, buffers=2)
    assert b.hot_rows == 1000 and b.buffers == 2
    assert b.spare_bytes == GiB - 1000 * 512 - 2 * 1000 * 512 - b.queue_bytes
    assert "wanted" not in b.describe()


def test_split_refusal_names_largest_buffer_and_smallest_budget() -> None:
    with pytest.raises(ValueError) as err:
        MemoryBudget.split(256 * MiB, row_bytes=512, hot_rows=0, buffer_rows=400_000,
                           buffers=2, queue_bytes=64 * MiB)
    message = str(err.value)
    largest = (256 * MiB - 64 * MiB) // (2 * 512)
    assert f"largest mega-batch buffer that fits is {largest:,} rows" in message
    assert f"at least {format_bytes(2 * 400_000 * 512 + 64 * MiB)}" in message
    # the largest buffer it names does fit
    MemoryBudget.split(256 * MiB, row_bytes=512, hot_rows=0, buffer_rows=largest, buffers=2, queue_bytes=64 * MiB)


def test_held_arrays_come_out_of_the_hot_cache() -> None:
    """The x arrays the consumer holds are in the budget: the hot cache gives them room."""
    kw = dict(row_bytes=512, hot_rows=10**7, buffer_rows=100_000, buffers=2, queue_bytes=64 * MiB)
    without, held = MemoryBudget.split(GiB, **kw), MemoryBudget.split(GiB, **kw, held_bytes=100 * MiB)
    assert held.hot_rows == without.hot_rows - 100 * MiB // 512
    assert held.hot_bytes + held.buffer_bytes + held.queue_bytes + held.held_bytes + held.spare_bytes == GiB
    assert 0 <= held.spare_bytes < 512 and "x arrays 100 MiB, spare" in held.describe()


def test_held_arrays_beyond_the_hot_cache_exceed_the_budget_and_say_so() -> None:
    """A budget whose buffers and queues leave less than the held arrays is not refused (their
    size is an estimate): no hot cache, and the describe line says by how much it is over."""
    b = MemoryBudget.split(256 * MiB, row_bytes=512, hot_rows=10**6, buffer_rows=100_000, buffers=2,
                           queue_bytes=64 * MiB, held_bytes=200 * MiB)
    assert b.hot_rows == 0
    over = 2 * 100_000 * 512 + 64 * MiB + 200 * MiB - 256 * MiB
    assert b.spare_bytes == -over and f"over by {format_bytes(over)}" in b.describe()


@pytest.mark.parametrize("key, kwargs", [("row_bytes", {"row_bytes": 0}),
                                         ("buffer_rows", {"buffer_rows": 0}),
                                         ("buffers", {"buffers": 0})])
def test_split_rejects_nonsense(key: str, kwargs: dict) -> None:
    args = {"row_bytes": 512, "hot_rows": 0, "buffer_rows": 10, "buffers": 2, **kwargs}
    with pytest.raises(ValueError, match=key):
        MemoryBudget.split(GiB, **args)


def _with_free(disk: os.statvfs_result, free: int) -> os.statvfs_result:
    """`disk` (a real os.statvfs) as if `free` bytes were available."""
    fields = list(disk)
    fields[4] = free // disk.f_frsize  # f_bavail
    return os.statvfs_result(fields)


def test_auto_block_budget_follows_features_and_free_disk(tmp_path) -> None:
    disk = os.statvfs(tmp_path)
    free = disk.f_bavail * disk.f_frsize
    budget = 64 * MiB
    # the budget holds the features, or half of them: extents only
    assert auto_block_budget(60 * MiB, budget, disk) == 0
    assert auto_block_budget(2 * budget, budget, disk) == 0
    # features many times the budget: their size, or a quarter of the free disk
    features = min(GiB, free // 8)  # the features' size below a quarter of the free disk
    assert auto_block_budget(features, budget, disk) == features > 0
    assert auto_block_budget(features, budget, _with_free(disk, 2 * features)) == features // 2
    assert auto_block_budget(10 * GiB, budget, _with_free(disk, 2 * GiB)) == GiB // 2
    # the disk too full for a window of a buffer's size: extents only
    assert auto_block_budget(10 * GiB, budget, _with_free(disk, 200 * MiB)) == 0
    # with packers (their windows' rows wait in mapped files): three times the features' size
    assert auto_block_budget(features, budget, _with_free(disk, 16 * features), PACKED_FEATURE_SHARE) == 3 * features
    assert auto_block_budget(features, budget, _with_free(disk, 8 * features), PACKED_FEATURE_SHARE) == 2 * features


def test_resolve_block_budget_says_what_it_chose(tmp_path) -> None:
    assert resolve_block_budget(0, 10 * GiB, 64 * MiB, tmp_path)[0] == 0
    assert resolve_block_budget(GiB, 10 * GiB, 64 * MiB, tmp_path)[0] == GiB
    size, why = resolve_block_budget("auto", 60 * MiB, 64 * MiB, tmp_path / "not" / "yet")
    assert size == 0 and why.startswith("ssd.block_budget auto: 0 B") and str(tmp_path) in why


# --- the ssd loader's split: a pure function of sizes and a mini-batch's cold rows ---------

MiB = 1 << 20


def test_ssd_split_gives_the_buffers_their_share_and_the_hot_cache_the_rest() -> None:
    """A small mini-batch: the buffers take (1 - hot_fraction) of what the queues leave, the
    hot cache what remains; the function of cold rows is asked with the hot count that
    leaves the buffers their share."""
    asked = []
    budget = ssd_split(100 * MiB, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: asked.append(hot) or 100)
    share = int(90 * MiB * 0.5) // (2 * 1024)
    assert budget.buffer_rows == share and budget.buffers == 2
    assert asked == [90 * MiB // 1024 - 2 * share]
    assert budget.hot_rows == (100 * MiB - 10 * MiB - 2 * share * 1024) // 1024
    assert budget.spare_bytes == 0


def test_ssd_split_takes_the_x_arrays_before_the_buffers_and_hot_cache_share_the_rest() -> None:
    """The x arrays come first; buffers and hot cache split what is left as without them."""
    asked = []
    budget = ssd_split(100 * MiB, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: asked.append(hot) or 100,
                       held_bytes=30 * MiB)
    share = int(60 * MiB * 0.5) // (2 * 1024)
    assert budget.buffer_rows == share and budget.held_bytes == 30 * MiB
    assert asked == [60 * MiB // 1024 - 2 * share]
    assert budget.hot_rows == (100 * MiB - 10 * MiB - 30 * MiB - 2 * share * 1024) // 1024
    assert budget.spare_bytes == 0


def test_ssd_split_grows_the_buffers_for_a_large_minibatch_that_fits() -> None:
    needed = 20_000  # cold rows: 1.5x of it is above the share (23,040) and fits (46,080 a buffer)
    budget = ssd_split(100 * MiB, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: needed)
    assert budget.buffer_rows == int(MINIBATCH_MARGIN * needed)
    # one that would not fit keeps the share: the planner streams it in pieces
    budget = ssd_split(100 * MiB, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: 10**6)
    assert budget.buffer_rows == int(90 * MiB * 0.5) // (2 * 1024)


def test_ssd_split_grows_the_buffers_only_to_what_still_holds_a_minibatch_beside_the_smaller_hot_cache() -> None:
    """Cold rows grow as the hot cache shrinks (fewer of the hottest rows cached). Buffers
    grown for the cold rows beside the share's hot cache (~30k cold: 45k a buffer) would
    leave 2k hot rows, beside which a mini-batch has ~59k cold rows: it would still be read
    in pieces, with no hot cache. The share is kept, and the hot cache with it."""
    room_rows, share = 90 * MiB // 1024, int(90 * MiB * 0.5) // (2 * 1024)
    budget = ssd_split(100 * MiB, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: 60_000 - int(0.65 * hot))
    assert budget.buffer_rows == share and budget.hot_rows == room_rows - 2 * share
    # a mini-batch whose cold rows the grown buffers still hold beside their hot cache: grown
    budget = ssd_split(100 * MiB, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: 30_000 - hot // 10)
    assert budget.buffer_rows == int(MINIBATCH_MARGIN * (30_000 - (room_rows - 2 * share) // 10))
    assert 30_000 - budget.hot_rows // 10 <= budget.buffer_rows


def test_ssd_split_hot_cache_wants_no_more_rows_than_the_file_has() -> None:
    budget = ssd_split(100 * MiB, 1024, 10 * MiB, 0.5, 1000, 2, lambda hot: 10)
    assert budget.hot_rows == budget.hot_rows_wanted == 1000 and budget.spare_bytes > 0


def test_ssd_split_refuses_a_budget_below_two_least_buffers_naming_the_least() -> None:
    least = 2 * MIN_BUFFER_BYTES + 10 * MiB
    with pytest.raises(ValueError, match=rf"11 MiB is too small: 10 MiB of queues and staging plus 2 buffers "
                                         rf"of at least 1,024 rows of 1024 B need at least 12 MiB \({least} bytes\)"):
        ssd_split(11 * MiB, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: 10)
    assert ssd_split(least, 1024, 10 * MiB, 0.5, 10**6, 2, lambda hot: 10).buffer_rows == MIN_BUFFER_BYTES // 1024
