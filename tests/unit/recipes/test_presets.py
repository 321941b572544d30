"""Quickstart presets: overrides are checked by name and value, and the quickstart mixes the
regeneration order of its sources only when a time budget can cut regeneration."""

from __future__ import annotations

import pytest

from eaglewire.errors import ConfigError, TargetFilesError
from eaglewire.recipes.presets import PRESETS, get_preset


def test_overrides_replace_fields_and_none_keeps_the_preset():
    gpu = get_preset("gpu", {"data.regen_max_seconds": 60.0, "train.max_seconds": None})
    assert gpu.data.regen_max_seconds == 60.0
    assert gpu.train.max_seconds == PRESETS["gpu"].train.max_seconds


def test_bad_overrides_name_the_field():
    with pytest.raises(ConfigError, match="regen_max_seconds must be >= 0"):
        get_preset("gpu", {"data.regen_max_seconds": -1.0})
    with pytest.raises(ConfigError, match="user_turns must be >= 1, got 0"):
        get_preset("gpu", {"data.user_turns": 0})
    with pytest.raises(ConfigError, match="preset 'gpu': ttt_steps.*0"):
        get_preset("gpu", {"train.ttt_steps": 0})
    # the train stage's own cross-field checks run before any stage does
    with pytest.raises(ConfigError, match=r"preset 'tiny': max_length=160 is too short for ttt_steps=200"):
        get_preset("tiny", {"train.ttt_steps": 200})
    with pytest.raises(ConfigError, match="unknown field 'no_such_field'"):
        get_preset("cpu", {"no_such_field": 1})
    with pytest.raises(ConfigError, match="unknown field 'train.chitchat_conversations'"):
        get_preset("cpu", {"train.chitchat_conversations": 1})
    with pytest.raises(ConfigError, match="unknown field 'data'"):
        get_preset("cpu", {"data": None})
    with pytest.raises(ConfigError, match="--preset"):
        get_preset("tpu")


def test_every_preset_budgets_fit_twenty_minutes():
    # regenerate -> train must leave room for tokenizing and evaluating inside the 20-minute goal
    for preset in PRESETS.values():
        assert preset.data.regen_max_seconds + preset.train.max_seconds <= 20 * 60 - 180, preset.name


@pytest.mark.parametrize("budget", [0.0, 30.0])
def test_regeneration_order_is_mixed_only_under_a_time_budget(tmp_path, budget):
    import hashlib

    from eaglewire.recipes.quickstart import QuickstartRun
    from eaglewire.recipes.quickstart_data import _conversations

    preset = get_preset("cpu", {"data.chitchat_conversations": 20, "data.regen_max_seconds": budget})
    ids = [c.record_id for c in _conversations(QuickstartRun(preset, tmp_path), "train", None)]
    assert len(ids) == 20 + preset.data.humaneval_problems
    if budget:  # a fixed mixed order: a budget that stops early still covers every source
        assert ids == sorted(ids, key=lambda i: hashlib.sha256(i.encode("utf-8")).hexdigest())
    else:  # the sources stay grouped, chitchat first
        assert all(i.startswith("chitchat:") for i in ids[:20])
        assert all(i.startswith("humaneval:") for i in ids[20:])


def test_quickstart_flags_reach_the_preset(monkeypatch):
    """`eaglewire quickstart --train-compile --regen-batched ...` override the preset's fields."""
    from typer.testing import CliRunner

    import eaglewire.recipes.quickstart as quickstart
    from eaglewire.cli import app

    seen = {}

    def fake_run(run):  # stop before any work: only the preset is checked here
        seen["preset"] = run.preset
        raise SystemExit(0)

    monkeypatch.setattr(quickstart, "run_quickstart", fake_run)
    args = [
        "quickstart",
        "--preset",
        "tiny",
        "--train-compile",
        "--regen-batched",
        "--train-max-seconds",
        "7",
        "--train-online",
        "--ttt-steps",
        "5",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    preset = seen["preset"]
    assert preset.train.compile is True and preset.data.regen_continuous is False
    assert preset.train.max_seconds == 7.0
    assert PRESETS["tiny"].data.train_from_shards and preset.data.train_from_shards is False
    assert preset.train.ttt_steps == 5 != PRESETS["tiny"].train.ttt_steps
    result = CliRunner().invoke(app, ["quickstart", "--preset", "gpu", "--train-from-shards"])
    assert result.exit_code == 0, result.output
    assert not PRESETS["gpu"].data.train_from_shards and seen["preset"].data.train_from_shards is True
    assert seen["preset"].decode.hf_baseline_sets == PRESETS["gpu"].decode.hf_baseline_sets == ("mt-bench",)
    result = CliRunner().invoke(
        app, ["quickstart", "--preset", "gpu", "--skip-hf-baselines", "--regen-max-new-tokens", "512"]
    )
    assert result.exit_code == 0, result.output
    assert seen["preset"].decode.hf_baseline_sets == () and seen["preset"].data.regen_max_new_tokens == 512
    assert PRESETS["gpu"].data.regen_max_new_tokens == 256
    flags = [
        "quickstart",
        "--preset",
        "gpu",
        "--regen-rows",
        "1024",
        "--source-repeats",
        "chitchat:2,humaneval:4",
    ]
    result = CliRunner().invoke(app, flags)
    assert result.exit_code == 0, result.output
    assert seen["preset"].data.regen_rows == 1024
    assert seen["preset"].train.source_repeats == ("chitchat:2", "humaneval:4")
    assert seen["preset"].train.repeats_by_source() == {"chitchat": 2, "humaneval": 4}


def test_an_answer_longer_than_max_length_is_refused_naming_both_fields():
    with pytest.raises(ConfigError, match=r"data.regen_max_new_tokens=1024 with train.max_length=1024"):
        get_preset("gpu", {"data.regen_max_new_tokens": 1024})


def test_sets_outside_prompt_sets_are_refused_naming_both_fields():
    with pytest.raises(ConfigError, match=r"hf_baseline_sets / whole_sets name \['mt-bench'\].*prompt_sets"):
        get_preset("cpu", {"decode.whole_sets": ("mt-bench",)})
    with pytest.raises(ConfigError, match=r"name \['humaneval-eval'\]"):
        get_preset("tiny", {"decode.hf_baseline_sets": ("humaneval-eval",)})


def test_decode_runs_take_the_user_like_sets_first_then_the_in_distribution_ones_then_the_baselines():
    from eaglewire.bench.prompts import MT_BENCH_COUNT, load_prompt_set
    from eaglewire.recipes.quickstart_decode import DecodeRun, decode_runs, prompt_set_kinds

    gpu = PRESETS["gpu"]
    runs = decode_runs(gpu.decode)
    assert runs == [
        DecodeRun("mt-bench-all", "mt-bench", None, False),  # our decoders on all 80, no baselines
        DecodeRun("user-eval-all", "user-eval", None, False),  # all 84: the file is grouped by category
        DecodeRun("chitchat-eval", "chitchat-eval", gpu.decode.prompts, False),
        DecodeRun("humaneval-eval", "humaneval-eval", gpu.decode.prompts, False),
        DecodeRun("mt-bench", "mt-bench", gpu.decode.hf_baseline_prompts, True),  # the slow baselines last
    ]
    assert prompt_set_kinds(gpu.decode) == {
        "mt-bench-all": "user-like", "user-eval-all": "user-like", "mt-bench": "user-like",
        "chitchat-eval": "in-distribution held-out", "humaneval-eval": "in-distribution held-out",
    }  # fmt: skip
    whole = load_prompt_set(runs[0].prompt_set, runs[0].num_prompts)
    assert len(whole.prompts) == MT_BENCH_COUNT
    first = load_prompt_set(runs[4].prompt_set, runs[4].num_prompts)
    assert [p.prompt_id for p in whole.prompts[: gpu.decode.hf_baseline_prompts]] == [
        p.prompt_id for p in first.prompts
    ]
    # without the baselines (quickstart --skip-hf-baselines) a whole set is decoded once, whole
    skipped = decode_runs(get_preset("gpu", {"decode.hf_baseline_sets": ()}).decode)
    assert [(r.name, r.num_prompts) for r in skipped] == [
        ("mt-bench-all", None), ("user-eval-all", None),
        ("chitchat-eval", gpu.decode.prompts), ("humaneval-eval", gpu.decode.prompts),
    ]  # fmt: skip
    # a baseline set that is not decoded whole keeps one run; hf_baseline_prompts=0 means prompts
    cpu_hf = decode_runs(get_preset("cpu", {"decode.hf_baseline_sets": ("humaneval-eval",)}).decode)
    assert cpu_hf[-1] == DecodeRun("humaneval-eval", "humaneval-eval", PRESETS["cpu"].decode.prompts, True)
    assert [r.name for r in cpu_hf] == ["user-eval", "chitchat-eval", "humaneval-eval"]  # user-like first
    assert [r.name for r in decode_runs(PRESETS["cpu"].decode)] == list(PRESETS["cpu"].decode.prompt_sets)


def test_cli_overrides_reach_the_preset(tmp_path):
    """Every override flag names a real preset field (get_preset refuses unknown ones before the
    first stage): a run with all of them set gets as far as the missing target."""
    from typer.testing import CliRunner

    from eaglewire.cli import app

    flags = [
        "--chitchat",
        "3",
        "--user-turns",
        "1",
        "--magpie",
        "2",
        "--magpie-opened-fraction",
        "0.5",
        "--draft-vocab-size",
        "300",
        "--draft-intermediate-size",
        "96",
    ]
    flags += ["--epochs", "1", "--batch-size", "2", "--learning-rate", "1e-3"]
    flags += ["--regen-max-seconds", "0", "--train-max-seconds", "0", "--regen-batched", "--train-eager"]
    args = [
        "quickstart",
        "--preset",
        "tiny",
        "--target",
        str(tmp_path / "none"),
        "--out",
        str(tmp_path / "run"),
    ]
    r = CliRunner().invoke(app, [*args, *flags])
    assert isinstance(r.exception, TargetFilesError), r.exception


def test_the_gpu_preset_decodes_the_held_out_prompts_its_eval_stage_replays():
    """decode_prompts covers the eval stage's held-out conversations (eval_conversations per set), so the
    served tau is measured on the prompts whose answers predicted it, not on a sample of 8."""
    from eaglewire.bench.prompts import load_prompt_set
    from eaglewire.data.builtin import load_builtin

    gpu = PRESETS["gpu"]
    for prompt_set, data_set in (("chitchat-eval", "chitchat"), ("humaneval-eval", "humaneval")):
        replayed = [c.record_id for c in load_builtin(data_set, "eval")[: gpu.data.eval_conversations]]
        decoded = [p.prompt_id for p in load_prompt_set(prompt_set, gpu.decode.prompts).prompts]
        assert decoded == replayed, prompt_set
    assert len(decoded) == 33  # HumanEval's whole held-out split


def test_negative_prompt_counts_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"hf_baseline_prompts must be >= 0, got -1"):
        get_preset("gpu", {"decode.hf_baseline_prompts": -1})
    with pytest.raises(ConfigError, match=r"prompts must be >= 0, got -2"):
        get_preset("cpu", {"decode.prompts": -2})


def test_malformed_source_repeats_and_negative_rows_are_refused_naming_the_preset():
    with pytest.raises(ConfigError, match=r"preset 'gpu': source_repeats: expected 'SOURCE:N'.*'chitchat:0'"):
        get_preset("gpu", {"train.source_repeats": ("chitchat:0",)})
    with pytest.raises(ConfigError, match="preset 'gpu': regen_rows must be >= 0"):
        get_preset("gpu", {"data.regen_rows": -1})
