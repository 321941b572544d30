"""plan_rows: every record placed once, rows within max_length, slots back to back, the same plan
for the same arguments, and first-fit over a few open rows filling rows better than next-fit; the
repeats TrainConfig.source_repeats gives records, by the source prefix of their ids."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from eaglewire.errors import ConfigError
from eaglewire.train.batches import PACK_OPEN_ROWS, epoch_order, plan_rows, record_repeats
from eaglewire.train.config import TrainConfig


def _lengths(n: int, seed: int = 0) -> list[int]:
    rnd = random.Random(seed)  # a mix like the quickstart's: many short answers, some long conversations
    return [
        rnd.choice([rnd.randint(20, 200), rnd.randint(200, 700), rnd.randint(700, 1200)]) for _ in range(n)
    ]


@pytest.mark.parametrize("open_rows", [1, 2, PACK_OPEN_ROWS])
def test_packed_rows_hold_every_record_once_within_max_length(open_rows: int) -> None:
    lengths = _lengths(500) + [0, 0]  # empty records are skipped
    order = epoch_order(len(lengths), seed=3, epoch=1)
    rows = plan_rows(lengths, order, max_length=1024, pack=True, open_rows=open_rows)
    placed = [s.record for row in rows for s in row]
    assert sorted(placed) == sorted(i for i, n in enumerate(lengths) if n > 0)
    for row in rows:
        assert sum(s.length for s in row) <= 1024
        assert [s.offset for s in row] == [sum(s.length for s in row[:k]) for k in range(len(row))]
        assert all(s.length == min(lengths[s.record], 1024) for s in row)  # longer records truncated
    assert rows == plan_rows(lengths, order, max_length=1024, pack=True, open_rows=open_rows)  # pure


def test_first_fit_over_open_rows_fills_rows_better_than_next_fit() -> None:
    lengths = _lengths(3000, seed=1)
    order = epoch_order(len(lengths), seed=0, epoch=0)
    real = sum(min(n, 1024) for n in lengths)

    def fill(open_rows: int) -> float:
        return real / (1024 * len(plan_rows(lengths, order, max_length=1024, pack=True, open_rows=open_rows)))

    assert fill(1) < 0.85 < 0.95 < fill(PACK_OPEN_ROWS)


def test_next_fit_keeps_record_order_and_unpacked_rows_hold_one_record() -> None:
    lengths = [300, 500, 400, 100, 900, 50]
    rows = plan_rows(lengths, range(6), max_length=1024, pack=True, open_rows=1)
    assert [[s.record for s in row] for row in rows] == [[0, 1], [2, 3], [4, 5]]
    first_fit = plan_rows(lengths, range(6), max_length=1024, pack=True, open_rows=2)
    # 3 joins the first row; 4 fits neither, so the fullest row closes; 5 goes to the first with room
    assert [[s.record for s in row] for row in first_fit] == [[0, 1, 3], [2, 5], [4]]
    assert [[s.record for s in row] for row in plan_rows(lengths, range(6), max_length=1024, pack=False)] == [
        [i] for i in range(6)
    ]
    with pytest.raises(ValueError, match="open_rows must be >= 1"):
        plan_rows(lengths, range(6), max_length=1024, pack=True, open_rows=0)


def test_repeated_records_appear_as_often_as_asked_and_shuffle_with_the_rest() -> None:
    """source_repeats: record i appears repeats[i] times in an epoch's order, a pure function of
    (seed, epoch, repeats); without repeats the order is the plain permutation it always was."""
    repeats = [1, 3, 1, 2]
    order = epoch_order(4, seed=0, epoch=1, repeats=repeats)
    assert sorted(order) == [0, 1, 1, 1, 2, 3, 3]
    assert order == epoch_order(4, seed=0, epoch=1, repeats=repeats)
    assert order != epoch_order(4, seed=0, epoch=2, repeats=repeats)
    assert epoch_order(4, seed=0, epoch=1, repeats=[1, 1, 1, 1]) == epoch_order(4, seed=0, epoch=1)
    with pytest.raises(ValueError, match="3 repeat counts for 4 records"):
        epoch_order(4, seed=0, epoch=1, repeats=[1, 1, 1])


def test_record_repeats_go_by_the_source_prefix_of_each_id() -> None:
    records = [
        SimpleNamespace(record_id=rid) for rid in ("chitchat:1", "magpie:ab", "chitchat:2", "humaneval:H/0")
    ]
    config = TrainConfig(source_repeats=("chitchat:2", "humaneval:4"))
    assert record_repeats(records, config) == [2, 1, 2, 4]
    assert record_repeats(records, TrainConfig()) is None
    with_ids = SimpleNamespace(
        record_ids=lambda: ["chitchat:1"], __len__=lambda: 1
    )  # a ShardDataset's method
    assert record_repeats(with_ids, TrainConfig(source_repeats=("chitchat:3",))) == [3]
    with pytest.raises(
        ConfigError, match=r"names \['chitchats'\].*sources here: \['chitchat', 'humaneval', 'magpie'\]"
    ):
        record_repeats(records, TrainConfig(source_repeats=("chitchats:2",)))


@pytest.mark.parametrize("entry", ["chitchat", "chitchat:0", ":2", "chitchat:two"])
def test_malformed_source_repeats_are_refused_by_name(entry: str) -> None:
    with pytest.raises(ConfigError, match="source_repeats: expected 'SOURCE:N'"):
        TrainConfig(source_repeats=(entry,))
    with pytest.raises(ConfigError, match="named twice"):
        TrainConfig(source_repeats=("a:2", "a:3"))
