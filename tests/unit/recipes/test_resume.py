"""A rerun in the same quickstart run directory reuses only stages its preset changes do not feed."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from eaglewire.errors import ConfigError
from eaglewire.recipes.presets import PRESETS, QuickstartPreset
from eaglewire.recipes.quickstart import QuickstartRun
from eaglewire.recipes.resume import FIELD_STAGE, PACE_FIELDS, STAGES, check_resume, preset_json

TINY = PRESETS["tiny"]


def run_dir(tmp_path: Path, done: tuple[str, ...], started: tuple[str, ...] = ()) -> Path:
    for s in done:
        (tmp_path / f"{s}.json").write_text("{}")
    for s in started:
        (tmp_path / s).mkdir()
    return tmp_path


def test_every_preset_field_names_the_first_stage_it_feeds() -> None:
    assert set(FIELD_STAGE) == {f.name for f in fields(QuickstartPreset)}
    assert set(FIELD_STAGE.values()) <= set(STAGES) and set(FIELD_STAGE) >= PACE_FIELDS


def test_a_change_feeding_a_finished_stage_is_refused_with_both_values_and_the_markers(
    tmp_path: Path,
) -> None:
    out = run_dir(tmp_path, ("target", "data", "train", "eval"), started=("data", "train"))
    old = preset_json(TINY)
    with pytest.raises(ConfigError) as err:
        check_resume(out, old, replace(TINY, learning_rate=2e-3))
    msg = str(err.value)
    assert "learning_rate: 0.001 -> 0.002 (feeds train; train done, eval done)" in msg
    assert "delete train.json, eval.json, train/ in" in err.value.fix and "data.json" not in err.value.fix
    with pytest.raises(ConfigError, match=r"chain_steps: 3 -> 4 \(feeds eval; eval done\)\n") as err:
        check_resume(
            out, old, replace(TINY, prompt_sets=("humaneval-eval",), decode_prompts=2, chain_steps=4)
        )
    assert "prompt_sets" not in str(err.value)  # it feeds decode, which has not run
    check_resume(out, old, TINY)  # nothing changed
    check_resume(out, old, replace(TINY, decode_prompts=3, timing_repeats=2))  # decode has not run yet
    check_resume(
        out, {k: v for k, v in old.items() if k != "draft_intermediate_size"}, TINY
    )  # an older preset.json


def test_a_started_stage_continues_under_new_pace_but_not_new_results(tmp_path: Path) -> None:
    out = run_dir(tmp_path, ("target", "data"), started=("data", "train"))
    old = preset_json(TINY)
    check_resume(out, old, replace(TINY, train_max_seconds=60.0, train_compile=True))  # a longer budget
    with pytest.raises(
        ConfigError, match=r"draft_intermediate_size: 0 -> 96 \(feeds train; train started\)"
    ) as err:
        check_resume(out, old, replace(TINY, draft_intermediate_size=96))
    assert "delete train/ in" in err.value.fix
    with pytest.raises(ConfigError, match=r"regen_max_seconds: 0.0 -> 30.0 \(feeds data; data done\)"):
        check_resume(out, old, replace(TINY, regen_max_seconds=30.0))  # done: the data it made is what it is


def test_a_stage_that_runs_again_drops_the_later_markers(tmp_path: Path) -> None:
    run = QuickstartRun(preset=TINY, out_dir=tmp_path)
    for s in ("target", "eval", "decode"):
        (tmp_path / f"{s}.json").write_text(json.dumps({"stage": s, "seconds": 1.0, "result": {"old": True}}))
    assert run.stage("target", lambda: {"new": True}) == {"old": True}  # done: reused, nothing dropped
    assert (tmp_path / "eval.json").exists()
    assert run.stage("train", lambda: {"new": True}) == {"new": True}
    assert not (tmp_path / "eval.json").exists() and not (tmp_path / "decode.json").exists()
    assert (tmp_path / "target.json").exists() and (tmp_path / "train.json").exists()
