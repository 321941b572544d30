"""Options derived from typed config fields: each knob is declared once, on its field, and the
commands keep the flags, defaults and types their users know."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer

from eaglewire.cli import app
from eaglewire.cli.config_options import ConfigOptions, FieldOption, field_value
from eaglewire.cli.flags import SPEC_OPTIONS
from eaglewire.cli.quickstart import QUICKSTART_OPTIONS
from eaglewire.cli.train import TRAIN_OPTIONS
from eaglewire.engine.spec_args import DEFAULT_SPEC
from eaglewire.recipes.presets import PRESETS, QuickstartPreset
from eaglewire.train.config import TrainConfig


def _options(command: str) -> dict[str, Any]:
    """The command's parameters by name (typer's own click)."""
    group: Any = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("train", TRAIN_OPTIONS),
        ("quickstart", QUICKSTART_OPTIONS),
        ("generate", SPEC_OPTIONS),
        ("serve", SPEC_OPTIONS),
    ],
)
def test_each_option_has_its_fields_type_default_and_help(command: str, options: ConfigOptions) -> None:
    params = _options(command)
    for r in options.resolved:
        param = params[r.param]
        assert tuple(param.opts + param.secondary_opts) == r.names
        assert param.bare_type() == r.cli_type().__name__, r.option.path
        assert param.default == (
            None if options.defaults is None else field_value(options.defaults, r.option.path)
        )
        assert param.help is not None and str(r.field.metadata["help"]) in param.help, r.option.path


def test_the_flags_users_know_keep_their_names() -> None:
    """The flags as they were when each was declared by hand: a rename breaks scripts."""
    assert [r.flag for r in TRAIN_OPTIONS.resolved] == [
        "--ttt-steps", "--hard-label-weight", "--align-topk", "--epochs", "--source-repeats", "--max-steps",
        "--batch-size", "--grad-accum-steps", "--max-length", "--learning-rate", "--warmup-ratio", "--eval-every",
        "--eval-max-records", "--checkpoint-every", "--seed", "--precision", "--parallel",
        "--tensorboard/--no-tensorboard", "--pack/--no-pack", "--compile/--no-compile", "--ttt-attention",
    ]  # fmt: skip
    assert {r.flag: r.option.path for r in QUICKSTART_OPTIONS.resolved} == {
        "--chitchat": "data.chitchat_conversations",
        "--user-turns": "data.user_turns",
        "--magpie": "data.magpie_prompts",
        "--magpie-opened-fraction": "data.magpie_opened_fraction",
        "--draft-vocab-size": "data.draft_vocab_size",
        "--draft-intermediate-size": "draft_intermediate_size",
        "--hard-label-weight": "train.hard_label_weight",
        "--epochs": "train.epochs",
        "--batch-size": "train.batch_size",
        "--learning-rate": "train.learning_rate",
        "--ttt-steps": "train.ttt_steps",
        "--regen-max-seconds": "data.regen_max_seconds",
        "--train-max-seconds": "train.max_seconds",
        "--regen-max-new-tokens": "data.regen_max_new_tokens",
        "--regen-continuous/--regen-batched": "data.regen_continuous",
        "--source-repeats": "train.source_repeats",
        "--regen-rows": "data.regen_rows",
        "--train-compile/--train-eager": "train.compile",
        "--train-ttt-attention": "train.ttt_attention",
        "--train-from-shards/--train-online": "data.train_from_shards",
        "--train-max-length": "train.max_length",
        "--regen-max-prompt-tokens": "data.regen_max_prompt_tokens",
        "--long-conversations": "data.long_conversations",
        "--long-documents": "data.long_documents",
        "--long-user-turns": "data.long_user_turns",
        "--long-max-tokens": "data.long_max_tokens",
        "--long-regen-batch-size": "data.long_regen_batch_size",
        "--long-regen-max-seconds": "data.long_regen_max_seconds",
    }
    assert [r.flag for r in SPEC_OPTIONS.resolved] == ["--num-steps", "--topk", "--num-draft-tokens"]
    assert [SPEC_OPTIONS.default(r) for r in SPEC_OPTIONS.resolved] == list(dataclasses.astuple(DEFAULT_SPEC))


def test_given_options_become_field_values_and_the_rest_stay_out() -> None:
    given = TRAIN_OPTIONS.given(
        {"source_repeats": "chitchat:2,humaneval:4", "pack": False, "ttt_steps": None}
    )
    assert given == {"source_repeats": ("chitchat:2", "humaneval:4"), "pack": False}
    assert dataclasses.replace(TrainConfig(), **given).repeats_by_source() == {"chitchat": 2, "humaneval": 4}
    assert QUICKSTART_OPTIONS.given({"train_max_seconds": 7.0, "chitchat": 3}) == {
        "train.max_seconds": 7.0,
        "data.chitchat_conversations": 3,
    }


def test_a_quickstart_options_help_ends_with_every_presets_value() -> None:
    (ttt,) = [r for r in QUICKSTART_OPTIONS.resolved if r.option.path == "train.ttt_steps"]
    values = ", ".join(f"{name} {p.train.ttt_steps}" for name, p in PRESETS.items())
    assert QUICKSTART_OPTIONS.help(ttt).endswith(f"(presets: {values})")


def test_a_field_the_command_line_cannot_type_needs_a_parser() -> None:
    with pytest.raises(TypeError, match="source_repeats.*needs FieldOption.parse"):
        ConfigOptions(TrainConfig, [FieldOption("source_repeats")]).parameters()
    with pytest.raises(KeyError, match="no field 'train.no_such_knob'"):
        ConfigOptions(QuickstartPreset, [FieldOption("train.no_such_knob")])
