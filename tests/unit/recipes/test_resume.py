"""A rerun in the same quickstart run directory reuses only stages its preset changes do not feed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.errors import ConfigError
from eaglewire.recipes.presets import PRESETS, with_overrides
from eaglewire.recipes.quickstart import QuickstartRun
from eaglewire.recipes.results import TrainStageResult
from eaglewire.recipes.resume import (
    FEEDS_EARLIER,
    PACE,
    check_resume,
    first_stage,
    flat_values,
    preset_json,
)

TINY = PRESETS["tiny"]

# preset.json of the tiny preset as releases wrote it before the preset nested its sub-configs
FLAT_TINY = {
    "name": "tiny", "device": "cpu", "target_dtype": "float32", "chitchat_conversations": 8,
    "humaneval_problems": 2, "magpie_prompts": 0, "user_turns": 1, "regenerate": True, "train_max_seconds": 0.0,
    "regen_max_seconds": 0.0, "regen_max_new_tokens": 12, "regen_temperature": 0.0, "regen_batch_size": 8,
    "eval_conversations": 2, "draft_vocab_size": 256, "ttt_steps": 2, "epochs": 1, "learning_rate": 0.001,
    "max_length": 160, "batch_size": 2, "decode_prompts": 1, "decode_max_new_tokens": 8,
    "prompt_sets": ["chitchat-eval"], "chain_steps": 3, "tree_num_steps": 2, "tree_topk": 2,
    "tree_num_draft_tokens": 4, "hf_baseline_sets": [], "timing_repeats": 1, "hf_baseline_prompts": 0,
    "whole_sets": [], "regen_continuous": False, "train_compile": False, "train_ttt_attention": "blocked",
    "draft_intermediate_size": 0, "regen_rows": 0, "magpie_opened_fraction": 0.0, "train_from_shards": True,
    "capture_max_batch_tokens": 0, "hard_label_weight": 0.0, "source_repeats": [],
}  # fmt: skip


def changed(**overrides: object) -> object:
    """TINY with dotted overrides written with '__' (`train__learning_rate=2e-3`)."""
    return with_overrides(TINY, {k.replace("__", "."): v for k, v in overrides.items()})


def run_dir(tmp_path: Path, done: tuple[str, ...], started: tuple[str, ...] = ()) -> Path:
    for s in done:
        (tmp_path / f"{s}.json").write_text("{}")
    for s in started:
        (tmp_path / s).mkdir()
    return tmp_path


def test_every_preset_value_feeds_a_stage_and_the_named_ones_exist() -> None:
    paths = set(flat_values(preset_json(TINY)))
    assert set(FEEDS_EARLIER) <= paths and paths >= PACE
    assert {first_stage(p) for p in paths} == {"target", "data", "train", "eval", "decode"}
    assert first_stage("train.max_length") == "data" and first_stage("train.epochs") == "train"
    assert first_stage("decode.tree_topk") == "decode" and first_stage("decode.chain_steps") == "eval"


def test_a_preset_json_from_before_the_nesting_reads_as_the_same_values() -> None:
    """A run made with the flat preset.json resumes: each old key is one nested value, all equal."""
    old, new = flat_values(FLAT_TINY), flat_values(preset_json(TINY))
    assert len(old) == len(FLAT_TINY) and set(old) <= set(new)
    assert {k: new[k] for k in old} == old
    assert old["train.max_seconds"] == 0.0 and old["decode.prompts"] == 1 and old["data.train_from_shards"]


def test_a_change_feeding_a_finished_stage_is_refused_with_both_values_and_the_markers(
    tmp_path: Path,
) -> None:
    out = run_dir(tmp_path, ("target", "data", "train", "eval"), started=("data", "train"))
    old = preset_json(TINY)
    with pytest.raises(ConfigError) as err:
        check_resume(out, old, changed(train__learning_rate=2e-3))
    msg = str(err.value)
    assert "train.learning_rate: 0.001 -> 0.002 (feeds train; train done, eval done)" in msg
    assert "delete train.json, eval.json, train/ in" in err.value.fix and "data.json" not in err.value.fix
    with pytest.raises(ConfigError, match=r"decode.chain_steps: 3 -> 4 \(feeds eval; eval done\)\n") as err:
        check_resume(
            out,
            old,
            changed(decode__prompt_sets=("humaneval-eval",), decode__prompts=2, decode__chain_steps=4),
        )
    assert "prompt_sets" not in str(err.value)  # it feeds decode, which has not run
    check_resume(out, old, TINY)  # nothing changed
    check_resume(out, old, changed(decode__prompts=3, decode__timing_repeats=2))  # decode has not run yet
    check_resume(
        out, {k: v for k, v in old.items() if k != "draft_intermediate_size"}, TINY
    )  # an older preset.json
    # the flat preset.json of older releases: the same checks, by the values' nested names
    check_resume(out, FLAT_TINY, TINY)
    with pytest.raises(ConfigError, match=r"train.max_length: 160 -> 200 \(feeds data; data done"):
        check_resume(out, FLAT_TINY, changed(train__max_length=200))


def test_a_started_stage_continues_under_new_pace_but_not_new_results(tmp_path: Path) -> None:
    out = run_dir(tmp_path, ("target", "data"), started=("data", "train"))
    old = preset_json(TINY)
    check_resume(out, old, changed(train__max_seconds=60.0, train__compile=True))  # a longer budget
    with pytest.raises(
        ConfigError, match=r"draft_intermediate_size: 0 -> 96 \(feeds train; train started\)"
    ) as err:
        check_resume(out, old, changed(draft_intermediate_size=96))
    assert "delete train/ in" in err.value.fix
    with pytest.raises(ConfigError, match=r"data.regen_max_seconds: 0.0 -> 30.0 \(feeds data; data done\)"):
        check_resume(out, old, changed(data__regen_max_seconds=30.0))  # done: the data it made is what it is


def test_a_stage_that_runs_again_drops_the_later_markers(tmp_path: Path) -> None:
    run = QuickstartRun(preset=TINY, out_dir=tmp_path)
    old, new = TrainStageResult("old", 1, 10, 1.0, None), TrainStageResult("new", 2, 20, 2.0, None)
    for s in ("target", "eval", "decode"):
        (tmp_path / f"{s}.json").write_text(json.dumps({"stage": s, "seconds": 1.0, "result": old.to_json()}))
    assert run.stage("target", TrainStageResult, lambda: new) == old  # done: reused, nothing dropped
    assert (tmp_path / "eval.json").exists()
    assert run.stage("train", TrainStageResult, lambda: new) == new
    assert not (tmp_path / "eval.json").exists() and not (tmp_path / "decode.json").exists()
    assert (tmp_path / "target.json").exists() and (tmp_path / "train.json").exists()
