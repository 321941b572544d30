"""Dataset build: counts for truncation, skips and source reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eaglewire.data import build
from eaglewire.data.build import build_dataset, load_source
from eaglewire.data.chat_masks import resolve_chat_template, tokenize_conversation
from eaglewire.data.formats import Conversation, Message
from eaglewire.errors import DataFormatError
from tests.helpers.tiny import tiny_tokenizer
from tests.unit.data.tokenizers import llama3_tokenizer, qwen3_tokenizer, qwen25_tokenizer


def test_truncation_and_no_loss_tokens_are_counted() -> None:
    long_user = "Hello! How are you today? " * 10
    convs = [
        Conversation("short", (Message("user", "Hello!"), Message("assistant", "I am fine, thank you."))),
        Conversation(
            "long-answer", (Message("user", "Hello!"), Message("assistant", "I am fine, thank you. " * 10))
        ),
        Conversation("answer-cut-off", (Message("user", long_user), Message("assistant", "I am fine."))),
    ]
    ds, stats = build_dataset(convs, tiny_tokenizer(), max_length=40, show_progress=False)
    assert ds.record_ids == ["short", "long-answer"]
    assert stats.truncated_records == 1 and stats.truncated_tokens > 0 and stats.skipped_no_loss_tokens == 1
    assert int(ds.lengths().max()) == 40
    assert ds.meta["build_stats"]["truncated_records"] == 1 and ds.meta["special_ids"] == [0, 1, 2]
    assert ds.meta["tokenizer_vocab_size"] == 384 and len(ds.meta["tokenizer_hash"]) == 64


def test_template_failure_is_named_or_skipped() -> None:
    tok = tiny_tokenizer()
    bad_template = "{{ raise_exception('roles must alternate') }}"
    convs = [Conversation("r1", (Message("user", "hi"), Message("assistant", "yo")))]
    with pytest.raises(DataFormatError, match="r1: the chat template failed to render"):
        build_dataset(convs, tok, chat_template=bad_template, show_progress=False)
    with pytest.raises(DataFormatError, match="no conversation produced a record"):
        build_dataset(convs, tok, chat_template=bad_template, skip_bad=True, show_progress=False)


def mixed_conversations() -> list[Conversation]:
    """Kept, truncated, cut to no assistant token, and unrenderable conversations, interleaved."""
    out = []
    for i in range(9):
        user = "Hello! How are you today? " * (12 if i % 4 == 2 else 1)
        answer = "I am fine, thank you. " * (1 + 3 * (i % 3))
        msgs = (
            Message("user", user),
            Message("assistant", answer),
            Message("user", "Bye"),
            Message("assistant", "Bye!"),
        )
        out.append(Conversation(f"c{i}", () if i % 4 == 3 else msgs))
    return out


@pytest.mark.parametrize(
    "make_tok",
    [tiny_tokenizer, llama3_tokenizer, qwen25_tokenizer, qwen3_tokenizer],
    ids=["chatml-smollm2", "llama3", "qwen2.5", "qwen3"],
)
def test_batched_build_equals_each_conversation_alone(make_tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = make_tok()
    convs = mixed_conversations()
    monkeypatch.setattr(build, "TOKENIZE_BATCH", 4)  # chunks of 4, 4 and 1 conversations
    ds, stats = build_dataset(convs, tok, max_length=100, skip_bad=True, show_progress=False)
    template = resolve_chat_template(tok)
    kept, no_loss, bad, cut = [], 0, 0, 0
    for conv in convs:
        try:
            r = tokenize_conversation(tok, conv, template, max_length=100)
        except DataFormatError:
            bad += 1
            continue
        if not bool(r.loss_mask.any()):
            no_loss += 1
            continue
        kept.append((conv.record_id, r))
        cut += r.truncated_tokens
    assert ds.record_ids == [rid for rid, _ in kept]
    for i, (_rid, r) in enumerate(kept):
        assert torch.equal(ds[i].input_ids, r.input_ids) and torch.equal(ds[i].loss_mask, r.loss_mask)
    assert stats.skipped_template_error == bad == 2 and stats.skipped_no_loss_tokens == no_loss > 0
    assert stats.truncated_tokens == cut and stats.truncated_records > 0 and stats.records == len(kept)
    with pytest.raises(DataFormatError, match="^c3: the chat template failed to render"):
        build_dataset(convs, tok, max_length=100, show_progress=False)


def test_load_source_file_and_builtin(tmp_path: Path) -> None:
    p = tmp_path / "f.jsonl"
    p.write_text(
        json.dumps({"prompt": "x"})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
        + "\n"
    )
    convs, stats = load_source(str(p), require_assistant=True)
    assert len(convs) == 1 and stats.skipped_no_assistant == 1
    convs, stats = load_source("builtin:humaneval", split="eval", require_assistant=True, limit=3)
    assert [c.record_id for c in convs] == [
        "humaneval:HumanEval/0",
        "humaneval:HumanEval/5",
        "humaneval:HumanEval/10",
    ]
