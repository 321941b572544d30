"""SGLang's meaning of num_steps / topk / num_draft_tokens; its silent rewrites are errors here."""

from __future__ import annotations

import logging
import re

import pytest

from eaglewire.engine.spec_args import (
    SpecArgs,
    max_candidates,
    sglang_effective_spec_args,
    spec_args_warnings,
)
from eaglewire.errors import ConfigError


def test_valid_shapes():
    assert SpecArgs(5, 4, 8).sglang_flags() == [
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
    ]  # fmt: skip
    chain = SpecArgs.chain(3)
    assert (chain.num_steps, chain.topk, chain.num_draft_tokens, chain.is_chain) == (3, 1, 4, True)
    assert max_candidates(5, 4) == 4 + 4 * 16


def test_field_report_rewrite_is_an_error_naming_both_fields():
    """--speculative-num-steps 1 --speculative-num-draft-tokens 16 (topk 1): SGLang ran 2 draft tokens."""
    with pytest.raises(ConfigError) as err:
        SpecArgs(num_steps=1, topk=1, num_draft_tokens=16)
    msg = str(err.value)
    assert "num_draft_tokens=16" in msg and "num_steps=1" in msg and "topk=1" in msg
    assert "num_draft_tokens=2" in msg  # what SGLang would have used
    assert "num_steps=15" in msg  # the fix for 15 draft tokens


def test_sglang_effective_reports_the_rewrite():
    effective, rewrites = sglang_effective_spec_args(1, 1, 16)
    assert effective == SpecArgs(1, 1, 2)
    assert [(r.field, r.requested, r.effective) for r in rewrites] == [("num_draft_tokens", 16, 2)]
    assert "--speculative-num-draft-tokens: requested 16, SGLang uses 2" in rewrites[0].explain()
    effective, rewrites = sglang_effective_spec_args(3, 1, 4)
    assert effective == SpecArgs.chain(3) and rewrites == []


def test_sglang_auto_choice_is_reported():
    effective, rewrites = sglang_effective_spec_args(None, None, None, architecture="LlamaForCausalLM")
    assert effective == SpecArgs(5, 4, 8)
    assert {r.field for r in rewrites} == {"num_steps", "topk", "num_draft_tokens"}
    effective, _ = sglang_effective_spec_args(None, None, None, architecture="Qwen2ForCausalLM")
    assert effective == SpecArgs(3, 1, 4)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((None, 4, 8), "SGLang asserts"),
        ((3, None, 8), "without"),
        ((2, 2, 20), "topk + (num_steps-1)*topk^2 = 6"),
        ((0, 1, 1), "positive"),
    ],
)
def test_combinations_sglang_rejects(args, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        sglang_effective_spec_args(*args)


def test_too_many_draft_tokens_for_the_tree():
    with pytest.raises(ConfigError, match="scores only"):
        SpecArgs(num_steps=2, topk=2, num_draft_tokens=8)
    SpecArgs(num_steps=2, topk=2, num_draft_tokens=7)  # 2 + 4 candidates + root


def test_root_only_and_non_integers_are_errors():
    with pytest.raises(ConfigError, match="drafts nothing"):
        SpecArgs(num_steps=3, topk=2, num_draft_tokens=1)
    with pytest.raises(ConfigError, match="positive integer"):
        SpecArgs(num_steps=2.0, topk=1, num_draft_tokens=3)  # type: ignore[arg-type]


def test_wasted_depth_is_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        args = SpecArgs(num_steps=6, topk=4, num_draft_tokens=4)
    assert spec_args_warnings(args)
    assert "never verified" in caplog.text
