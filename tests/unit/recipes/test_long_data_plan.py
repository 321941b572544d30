"""The quickstart's long training records (DataPlan.long_*): off in every preset, refused where training
would cut them, every kept user turn answered in order, sized to long_max_tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from eaglewire.errors import ConfigError
from eaglewire.recipes.presets import PRESETS, get_preset

# The documented GPU recipe's overrides (docs/data.md "Long-context training data").
LONG_GPU = {
    "data.long_conversations": 256,
    "data.long_documents": 512,
    "data.long_regen_batch_size": 128,
    "data.long_regen_max_seconds": 240.0,
    "train.max_length": 8192,
    "train.batch_size": 2,
    "data.regen_max_prompt_tokens": 768,
    "train.max_seconds": 600.0,
}


def test_off_in_every_preset() -> None:
    assert not any(p.data.has_long_records for p in PRESETS.values())


def test_long_records_need_a_train_max_length_that_admits_them() -> None:
    with pytest.raises(ConfigError, match=r"data.long_max_tokens=8192 is longer than train.max_length=1024"):
        get_preset("gpu", {"data.long_conversations": 10})
    with pytest.raises(ConfigError, match=r"data.long_max_tokens=4096 is longer than train.max_length=2048"):
        get_preset("gpu", {"data.long_documents": 10, "data.long_max_tokens": 4096, "train.max_length": 2048})
    ok = get_preset(
        "gpu", {"data.long_documents": 10, "data.long_max_tokens": 4096, "train.max_length": 4096}
    )
    assert ok.data.long_max_tokens == ok.train.max_length == 4096
    # off: the field is not checked against the rows
    assert get_preset("gpu", {"data.long_max_tokens": 8192}).train.max_length == 1024
    preset = get_preset("gpu", LONG_GPU)
    assert preset.data.has_long_records and preset.train.max_length == preset.data.long_max_tokens == 8192


def test_other_long_refusals_name_their_fields() -> None:
    with pytest.raises(ConfigError, match=r"long_documents=3 needs regenerate=True"):
        get_preset("cpu", {"data.long_documents": 3, "data.regenerate": False})
    with pytest.raises(
        ConfigError, match=r"long_max_tokens must leave a prompt room.*regen_max_new_tokens=256"
    ):
        get_preset("gpu", {**LONG_GPU, "data.long_max_tokens": 200})
    with pytest.raises(ConfigError, match=r"regen_max_prompt_tokens \+ data.regen_max_new_tokens must fit"):
        get_preset("gpu", {"data.regen_max_prompt_tokens": 900})
    for name in ("long_conversations", "long_user_turns", "regen_max_prompt_tokens"):
        with pytest.raises(ConfigError, match=f"{name} must be >= 0"):
            get_preset("gpu", {f"data.{name}": -1})


def test_the_documented_command_reaches_the_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import eaglewire.recipes.quickstart as quickstart
    from eaglewire.cli import app

    seen = {}

    def fake_run(run):
        seen["preset"] = run.preset
        raise SystemExit(0)

    monkeypatch.setattr(quickstart, "run_quickstart", fake_run)
    args = "--long-conversations 256 --long-documents 512 --long-regen-batch-size 128 --long-regen-max-seconds 240"
    args += " --train-max-length 8192 --batch-size 2 --regen-max-prompt-tokens 768 --train-max-seconds 600"
    result = CliRunner().invoke(app, ["quickstart", "--preset", "gpu", *args.split()])
    assert result.exit_code == 0, result.output
    assert seen["preset"] == get_preset("gpu", LONG_GPU)


def test_long_conversations_keep_every_turn_unless_told() -> None:
    import hashlib

    from eaglewire.data.long_training import long_chat
    from eaglewire.recipes.quickstart_long import long_conversations

    plan = get_preset("gpu", {**LONG_GPU, "data.long_documents": 2, "data.long_regen_max_seconds": 0.0}).data
    whole = long_conversations(plan)
    assert whole[:256] == long_chat("train")[:256]  # all turns, file order, then the documents
    assert [c.record_id.partition(":")[0] for c in whole[256:]] == ["pysource", "pysource"]
    cut = long_conversations(replace(plan, long_user_turns=3))
    assert [c.user_turns for c in cut] == [min(3, c.user_turns) for c in whole]
    # a regeneration budget may stop early: a fixed order mixes conversations and documents
    mixed = [c.record_id for c in long_conversations(replace(plan, long_regen_max_seconds=240.0))]
    assert mixed == sorted(mixed, key=lambda i: hashlib.sha256(i.encode("utf-8")).hexdigest())


def test_regeneration_answers_each_kept_user_turn_in_order(tmp_path: Path) -> None:
    from eaglewire.data.long_training import long_chat
    from eaglewire.recipes.quickstart import QuickstartRun
    from eaglewire.recipes.quickstart_long import long_training_records
    from tests.helpers.tiny import make_tiny_target

    overrides = {"data.long_conversations": 2, "data.long_user_turns": 3, "data.long_max_tokens": 160}
    run = QuickstartRun(get_preset("tiny", overrides), tmp_path)
    records = long_training_records(run, make_tiny_target("llama", num_layers=2))
    sources = long_chat("train")[:2]
    assert [r.record_id for r in records] == [s.record_id for s in sources]
    for record, source in zip(records, sources, strict=True):
        asked = [m.content for m in source.messages if m.role == "user"]
        kept = [m.content for m in record.messages if m.role == "user"]
        assert (
            1 <= len(kept) <= 3 and kept == asked[: len(kept)]
        )  # in order, cut where the prompt grows too long
        assert [m.role for m in record.messages] == ["user", "assistant"] * len(kept)
    assert (tmp_path / "data" / "train_long.jsonl").exists()


def test_without_regeneration_conversations_are_cut_to_fit(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from eaglewire.data.build import build_dataset
    from eaglewire.data.chat_masks import resolve_chat_template, tokenize_conversation
    from eaglewire.data.long_training import long_chat
    from eaglewire.recipes.quickstart import QuickstartRun
    from eaglewire.recipes.quickstart_long import long_training_records
    from tests.helpers.tiny import tiny_tokenizer

    preset = get_preset(
        "tiny", {"data.regenerate": False, "data.long_conversations": 3, "data.long_max_tokens": 150}
    )
    tok = tiny_tokenizer()
    records = long_training_records(QuickstartRun(preset, tmp_path), SimpleNamespace(tokenizer=tok))
    sources = long_chat("train")[:3]
    assert [r.record_id for r in records] == [s.record_id for s in sources]
    ds, stats = build_dataset(records, tok, max_length=preset.train.max_length, show_progress=False)
    assert stats.truncated_records == 0 and stats.records == 3
    template = resolve_chat_template(tok)
    for i, (record, source) in enumerate(zip(records, sources, strict=True)):
        n = len(record.messages)
        assert record.messages == source.messages[:n] and record.messages[-1].role == "assistant"
        assert len(ds[i].input_ids) <= 150
        # the next answer would not have fitted: the cut is the longest start that does
        longer = replace(source, messages=source.messages[: n + 2])
        assert len(tokenize_conversation(tok, longer, template).input_ids) > 150
