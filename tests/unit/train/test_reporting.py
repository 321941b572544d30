"""The training progress bar's total: the schedule's span, or with a wall-time budget the step the
run's pace reaches when the clock runs out (the schedule's span is only an estimate then)."""

from __future__ import annotations

import pytest

from eaglewire.train.reporting import Progress, budget_steps

SUMMARY = {"loss": 1.0, "acc": [0.5, 0.4]}


def test_the_budget_carries_the_pace_so_far_to_the_clock() -> None:
    # 100 steps in the first 10 s: 1,000 by 100 s
    assert budget_steps(3_720_000, 100, 10.0, (0, 0.0), 100.0) == 1_000
    assert budget_steps(500, 100, 10.0, (0, 0.0), 100.0) == 500  # never past the schedule's span
    assert budget_steps(7_440, 5, 1.0, (5, 1.0), 100.0) == 7_440  # no pace yet
    assert budget_steps(7_440, 300, 120.0, (0, 0.0), 100.0) == 300  # past the budget: the step it is at
    # resumed at step 400 after 40 s: the pace since then, not since step 0
    assert budget_steps(10_000, 450, 45.0, (400, 40.0), 100.0) == 450 + 550


@pytest.mark.parametrize("max_seconds", [0.0, 100.0])
def test_the_bar_ends_with_the_clock_when_there_is_a_budget(max_seconds: float) -> None:
    bar = Progress(total=3_720_000, initial=0, enabled=True, max_seconds=max_seconds)
    try:
        for step in range(1, 11):
            bar.update(SUMMARY, 1000.0, step=step, elapsed=0.5 * step)  # 2 steps a second
        expected = 10 + 2 * (100 - 5) if max_seconds else 3_720_000  # at step 10, 5 s in
        assert bar.bar.total == expected and bar.bar.n == 10
    finally:
        bar.close()
