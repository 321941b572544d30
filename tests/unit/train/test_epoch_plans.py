"""EpochPlans: each epoch planned on first access and equal to plan_groups; the schedule's step
count exact for step- and epoch-bounded runs and estimated, without planning ahead, for time-bounded
ones; repeated records placed as often as asked; the fingerprint a resume checks."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from eaglewire.errors import ConfigError, TrainingError
from eaglewire.train.batches import record_repeats
from eaglewire.train.config import TrainConfig
from eaglewire.train.epoch_plans import EpochPlans, check_resumed_plan, epoch_plan_sha256, plan_groups

LENGTHS = [random.Random(0).randint(20, 300) for _ in range(60)]
CONFIG = TrainConfig(max_length=512, batch_size=2, epochs=10_000)


def test_an_epoch_is_planned_when_first_asked_for_and_equals_plan_groups() -> None:
    plans = EpochPlans(LENGTHS, CONFIG, world_size=1)
    assert len(plans) == CONFIG.epochs and plans.planned == 0
    assert plans[7] == plan_groups(LENGTHS, CONFIG, epoch=7, world_size=1)
    assert plans[7] is plans[7] and plans.planned == 1
    assert plans[8] != plans[7] and plans[7] is plans[7]  # the epoch before the one asked for is kept
    assert plans[9] and plans.planned == 3
    assert plans[7] == plan_groups(LENGTHS, CONFIG, epoch=7, world_size=1) and plans.planned == 4  # replanned
    with pytest.raises(IndexError, match="epoch 10000 of 10000"):
        plans[CONFIG.epochs]


def test_a_time_bounded_schedule_is_estimated_from_the_first_epoch_without_planning_ahead() -> None:
    timed = TrainConfig(max_length=512, batch_size=2, epochs=10_000, max_seconds=60.0)
    plans = EpochPlans(LENGTHS, timed, world_size=1)
    assert plans.schedule_steps() == (len(plans[0]) * 10_000, False)
    assert plans.planned == 1
    # the log names the clock beside the estimate: the schedule follows whichever is further along
    assert plans.describe_span(*plans.schedule_steps()) == (
        f"an estimated {len(plans[0]) * 10_000} steps or max_seconds=60, whichever is further along"
    )
    assert EpochPlans(LENGTHS, CONFIG, world_size=1).describe_span(7, True) == "7 steps"


def test_step_and_epoch_bounded_schedules_are_exact() -> None:
    plans = EpochPlans(LENGTHS, TrainConfig(max_length=512, batch_size=2, epochs=5), world_size=1)
    assert plans.schedule_steps() == (
        sum(len(plan_groups(LENGTHS, CONFIG, epoch=e, world_size=1)) for e in range(5)),
        True,
    )
    per_epoch = len(plans[0])
    capped = EpochPlans(
        LENGTHS,
        TrainConfig(max_length=512, batch_size=2, epochs=10_000, max_steps=2 * per_epoch + 1),
        world_size=1,
    )
    assert capped.schedule_steps() == (2 * per_epoch + 1, True)
    assert capped.planned == 3  # the epochs max_steps reaches, not 10,000
    # max_steps and max_seconds: the steps bound the schedule, exactly
    both = TrainConfig(max_length=512, batch_size=2, epochs=10_000, max_steps=3, max_seconds=60.0)
    assert EpochPlans(LENGTHS, both, world_size=1).schedule_steps() == (3, True)


def test_an_epoch_plan_holds_each_repeated_record_as_often_as_asked() -> None:
    records = [SimpleNamespace(record_id=f"{'ab'[i % 2]}:{i}") for i in range(12)]
    lengths = [40] * 12
    config = TrainConfig(source_repeats=("a:3",), max_length=128, batch_size=2)
    (plan,) = EpochPlans(lengths, config, world_size=1, repeats=record_repeats(records, config))
    placed = [slot.record for group in plan for row in group for slot in row]
    assert all(placed.count(i) == (3 if i % 2 == 0 else 1) for i in range(12))
    (plain,) = EpochPlans(lengths, TrainConfig(max_length=128, batch_size=2), world_size=1)
    assert sorted(slot.record for group in plain for row in group for slot in row) == list(range(12))
    with pytest.raises(ConfigError, match="no repeat counts"):
        EpochPlans(lengths, config, world_size=1)


def test_a_resume_on_another_plan_is_refused_with_both_fingerprints(tmp_path) -> None:
    plans = EpochPlans(LENGTHS, CONFIG, world_size=1)
    saved = epoch_plan_sha256(plans, 3)
    check_resumed_plan(saved, plans, 3, 1, tmp_path)  # the same plan: accepted
    other = EpochPlans(LENGTHS[:-1], CONFIG, world_size=1)
    with pytest.raises(TrainingError, match=rf"epoch 3's plan of rows \(sha256 {saved[:12]}\) differs"):
        check_resumed_plan(saved, other, 3, 1, tmp_path)
    assert epoch_plan_sha256(plans, CONFIG.epochs) is None  # a checkpoint taken after the last epoch
