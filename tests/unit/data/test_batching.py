"""length_batches: longest first, bounded by rows and by padded tokens, every index once."""

from __future__ import annotations

from eaglewire.data.batching import length_batches


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
