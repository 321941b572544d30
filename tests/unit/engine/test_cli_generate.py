"""`eaglewire generate` on a saved tiny target and draft: --check-lossless, --json, chat template,
prompt files, and spec-argument errors that name both fields."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.cli.generate import first_difference, read_prompts
from eaglewire.draft.io import save_draft
from eaglewire.errors import ConfigError, DataFormatError
from tests.helpers.tiny import save_tiny_target
from tests.unit.engine.conftest import chat_ids

cli = CliRunner()


@pytest.fixture(scope="module")
def saved(tiny, trained, tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    target_dir = save_tiny_target(tiny.target, root / "target")
    draft_dir = save_draft(trained, tiny.contract, root / "draft")
    return target_dir, draft_dir


def invoke(saved, flags: str, *more: str):
    target_dir, draft_dir = saved
    return cli.invoke(
        app, ["generate", "--target", str(target_dir), "--draft", str(draft_dir), *shlex.split(flags), *more]
    )


@pytest.mark.parametrize("runner", ["hf", "auto"])
def test_check_lossless_json(saved, tiny, runner):
    flags = (
        "--num-steps 3 --topk 2 --num-draft-tokens 5 --max-new-tokens 12 --check-lossless --json --device cpu"
    )
    r = invoke(saved, flags, "--prompt", "Hello! How are you today?", "--runner", runner)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["spec"] == {"num_steps": 3, "topk": 2, "num_draft_tokens": 5}
    (result,) = out["results"]
    assert result["lossless"] is True
    assert len(result["token_ids"]) <= 12 and result["tau"] >= 1.0
    assert len(result["per_position_acceptance"]) == 3
    assert {"draft", "verify", "accept"} <= set(result["phase_times"])
    # the chat template was applied to the prompt
    assert result["prompt_tokens"] == len(chat_ids(tiny.target, "Hello! How are you today?"))


def test_prompts_file_table_output(saved, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hi there"}\n"What is your favourite book?"\n')
    flags = "--num-steps 2 --topk 1 --num-draft-tokens 3 --max-new-tokens 6 --temperature 0.7 --seed 3 --device cpu"
    r = invoke(saved, flags, "--prompts-file", str(prompts))
    assert r.exit_code == 0, r.output
    assert "--- prompt 1: 'What is your favourite book?'" in r.output
    assert "acceptance per position" in r.output


def test_sglang_rewrite_is_refused_with_both_fields(saved):
    r = invoke(saved, "--prompt x --num-steps 1 --topk 1 --num-draft-tokens 16")
    assert isinstance(r.exception, ConfigError)
    # named as the flags are typed, with the fix in the same spelling
    assert "--num-draft-tokens=16" in str(r.exception) and "--num-steps=1" in str(r.exception)
    assert "pass --num-draft-tokens=2" in str(r.exception)


def test_check_lossless_needs_greedy(saved):
    r = invoke(saved, "--prompt x --temperature 0.5 --check-lossless")
    assert isinstance(r.exception, ConfigError)
    assert "--temperature" in str(r.exception)


def test_prompt_sources_and_first_difference(tmp_path):
    assert read_prompts("a", None) == ["a"]
    with pytest.raises(ConfigError, match="exactly one"):
        read_prompts(None, None)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": 1}\n')
    with pytest.raises(DataFormatError, match="p.jsonl:1"):
        read_prompts(None, bad)
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize("runner", ["hf", "auto"])
def test_plain_decoding_needs_no_aux_boundaries(runner):
    """A 5-layer target has no default aux boundaries (2, L//2, L-3 = 2, 2, 2); decoding without a
    draft reads no aux states, so it decodes, token for token as the plain-decoding loop does."""
    from eaglewire.engine.api import SpeculativeDecoder
    from eaglewire.engine.plain import generate_plain
    from tests.helpers.tiny import make_tiny_target

    decoder = SpeculativeDecoder.load(make_tiny_target("llama", num_layers=5), None, runner=runner)
    result = decoder.generate("Hello!", max_new_tokens=5)
    plain = generate_plain(
        decoder.runner, [decoder.encode("Hello!")], 5, eos_token_ids=sorted(decoder.eos_token_ids)
    )
    assert result.token_ids == plain[0][: len(result.token_ids)] and result.tau == 1.0
