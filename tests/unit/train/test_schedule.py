"""The warmup + cosine schedule: unchanged without a time budget, led by the clock with one."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

import eaglewire.train.loop as loop_module
from eaglewire.draft.init import init_draft
from eaglewire.train.config import TrainConfig
from eaglewire.train.loop import train
from eaglewire.train.schedule import lr_at
from eaglewire.train.target_side import OfflineTarget, TargetHead

CFG = TrainConfig(learning_rate=1e-3, warmup_ratio=0.1, min_lr_ratio=0.1, max_length=64)


def step_schedule(step: int, total: int, cfg: TrainConfig) -> float:
    """The schedule as it was before time budgets (a copy, to pin it bit for bit)."""
    peak = cfg.learning_rate
    warm = math.ceil(cfg.warmup_ratio * total)
    if step < warm:
        return peak * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    floor = cfg.min_lr_ratio
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@pytest.mark.parametrize("warmup_ratio", [0.0, 0.02, 0.1, 0.5])
def test_without_a_budget_the_schedule_is_the_step_schedule(warmup_ratio):
    cfg = replace(CFG, warmup_ratio=warmup_ratio)
    for total in (1, 7, 100):
        for step in range(total + 2):
            assert lr_at(step, total, cfg) == step_schedule(step, total, cfg)
            assert lr_at(step, total, cfg, time_fraction=0.0) == step_schedule(step, total, cfg)


def test_the_clock_leads_when_it_is_further_along():
    total, peak, floor = 1000, CFG.learning_rate, CFG.learning_rate * CFG.min_lr_ratio
    # 15% of the steps done but the budget almost spent: the rate is at its floor, not near the peak
    assert lr_at(150, total, CFG, time_fraction=0.999) == pytest.approx(floor, rel=1e-4)
    assert lr_at(150, total, CFG) > 0.9 * peak
    # half-way through the decay by the clock (warmup is the first 10% of the budget)
    mid = floor + (peak - floor) * 0.5
    assert lr_at(200, total, CFG, time_fraction=0.55) == pytest.approx(mid, rel=1e-6)
    # warmup: the clock shortens it, never lengthens it
    assert lr_at(10, total, CFG, time_fraction=0.05) == pytest.approx(peak * 0.5)
    assert lr_at(10, total, CFG, time_fraction=0.0) == pytest.approx(peak * 11 / 100)
    assert lr_at(99, total, CFG, time_fraction=0.0) == peak
    # the steps lead when they are further along than the clock
    assert lr_at(999, total, CFG, time_fraction=0.2) == pytest.approx(floor, rel=1e-4)
    # the rate never increases along a run in which both clocks advance
    rates = [lr_at(s, total, CFG, time_fraction=min(1.0, s / 300)) for s in range(300)]
    assert all(b <= a + 1e-12 for a, b in zip(rates[100:], rates[101:], strict=False))
    assert rates[-1] == pytest.approx(floor, rel=1e-3)


class FakeClock:
    """perf_counter stand-in: every reading is `tick` seconds after the previous one."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_a_run_cut_by_its_budget_ends_at_the_low_rate(
    tiny_target, tiny_contract, captured_records, tmp_path, monkeypatch
):
    """With the cosine laid out over the epochs' steps, a budget that stops the run after a
    third of them leaves the rate near its peak; the time-led schedule ends at the floor."""
    monkeypatch.setattr(loop_module, "perf_counter", FakeClock(0.1))
    cfg = TrainConfig(
        ttt_steps=2,
        max_length=64,
        batch_size=4,
        learning_rate=1e-3,
        warmup_ratio=0.1,
        min_lr_ratio=0.0,
        epochs=50,  # 2 steps an epoch: 100 steps planned
        max_seconds=10.0,
    )

    def run(resume: bool):
        draft = init_draft(tiny_target, tiny_contract, seed=0)
        head = TargetHead.from_target(tiny_target, tiny_contract.final)
        side = OfflineTarget(head, tiny_contract, draft.draft_to_target)
        return train(
            cfg,
            draft,
            tiny_contract,
            captured_records,
            side,
            out_dir=tmp_path / "run",
            resume=resume,
            progress=False,
        )

    res = run(resume=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = [x["lr"] for x in lines if x["split"] == "train"]
    assert 10 < res.optimizer_steps < 60, res.optimizer_steps  # stopped by the budget, not the epochs
    assert max(rates) == pytest.approx(cfg.learning_rate, rel=0.2)  # warmed up to about the peak
    assert rates[-1] < 0.05 * cfg.learning_rate, rates  # and decayed to about the floor
    latest = json.loads((tmp_path / "run" / "latest.json").read_text())["checkpoint"]
    state = json.loads((tmp_path / "run" / latest / "trainer_state.json").read_text())
    assert state["train_seconds"] >= cfg.max_seconds
    # the budget is the run's, resumes included: resuming a run that spent it trains no further
    again = run(resume=True)
    assert again.optimizer_steps == res.optimizer_steps
