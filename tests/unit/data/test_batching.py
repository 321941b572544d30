"""length_batches: longest first, bounded by rows and by padded tokens, every index once.
capture_windows: consecutive whole shards, each window closed once it holds enough tokens."""

from __future__ import annotations

from eaglewire.data.batching import capture_windows, length_batches


def test_groups_longest_first_within_both_caps() -> None:
    lengths = [5, 40, 7, 40, 12, 3, 30, 8]
    groups = length_batches(lengths, batch_size=3, max_batch_tokens=100)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert groups[0] == [1, 3]  # 40 + 40: a third row would pad to 120 tokens
    for g in groups:
        assert len(g) <= 3 and max(lengths[i] for i in g) * len(g) <= 100
    firsts = [lengths[g[0]] for g in groups]
    assert firsts == sorted(firsts, reverse=True)


def test_a_record_longer_than_the_token_cap_goes_alone() -> None:
    assert length_batches([10, 500, 10], batch_size=8, max_batch_tokens=64) == [[1], [0, 2]]


def test_the_row_cap_binds_for_short_records() -> None:
    groups = length_batches([4] * 10, batch_size=4, max_batch_tokens=10_000)
    assert [len(g) for g in groups] == [4, 4, 2]


def test_windows_are_consecutive_whole_shards_closed_at_the_token_floor() -> None:
    assert capture_windows([30, 30, 50, 10, 10, 5], window_tokens=60) == [[0, 1], [2, 3], [4, 5]]
    assert capture_windows([100, 1], window_tokens=60) == [[0], [1]]  # a big shard is a window alone
    assert capture_windows([5, 5], window_tokens=1) == [[0], [1]]
    assert capture_windows([], window_tokens=60) == []


def test_windows_take_half_of_what_is_left_between_the_floor_and_the_ceiling() -> None:
    # 16 shards of 10 tokens: half of 160 is 80 (the ceiling 60 binds), then half of 100 is 50, then
    # half of 50 is 25 (the floor 30 binds), then the 20 left
    windows = capture_windows([10] * 16, window_tokens=30, max_window_tokens=60)
    assert [len(w) for w in windows] == [6, 5, 3, 2]
    assert [k for w in windows for k in w] == list(range(16))  # consecutive, every shard once
    # a ceiling below the floor is the floor: uniform windows, as with no ceiling
    assert capture_windows([10] * 6, 30, max_window_tokens=5) == capture_windows([10] * 6, 30)


def test_the_last_window_gives_its_leading_shards_to_the_one_before() -> None:
    windows = capture_windows([10] * 12, window_tokens=60, last_window_shards=4)
    assert windows == [list(range(8)), [8, 9, 10, 11]]
    assert capture_windows([10] * 12, 60, last_window_shards=6) == [list(range(6)), list(range(6, 12))]
    assert capture_windows([10] * 3, 60, last_window_shards=1) == [[0, 1, 2]]  # one window: kept whole
