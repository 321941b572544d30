"""Assistant-only loss masks from character offsets, for ChatML (SmolLM2), Llama-3, Qwen2.5 and Qwen3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from eaglewire.data.chat_masks import (
    Tokenized,
    assistant_spans,
    mask_from_offsets,
    resolve_chat_template,
    tokenize_conversation,
    tokenize_conversations,
    user_turn_prefix,
)
from eaglewire.data.formats import Conversation, Message, to_chat_messages
from eaglewire.errors import ConfigError, DataFormatError
from tests.helpers.tiny import tiny_tokenizer
from tests.unit.data.tokenizers import llama3_tokenizer, qwen3_tokenizer, qwen25_tokenizer

CONV = Conversation(
    "c1",
    (
        Message("system", "You are terse."),
        Message("user", "Hello there!"),
        Message("assistant", "Hello! How are you doing today?"),
        Message("user", "What is the capital of France?"),
        Message("assistant", "The capital of France is Paris."),
    ),
)


def masked_segments(tok: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Decoded runs of consecutive masked tokens."""
    out, cur = [], []
    for t, m in zip(ids.tolist(), mask.tolist(), strict=True):
        if m:
            cur.append(t)
        elif cur:
            out.append(tok.decode(cur))
            cur = []
    if cur:
        out.append(tok.decode(cur))
    return out


def mask_for(
    tok: Any, conv: Conversation = CONV, max_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    r = tokenize_conversation(tok, conv, resolve_chat_template(tok), max_length=max_length)
    return r.input_ids, r.loss_mask


@pytest.mark.parametrize(
    ("make_tok", "eot"),
    [(tiny_tokenizer, "<|im_end|>"), (llama3_tokenizer, "<|eot_id|>"), (qwen25_tokenizer, "<|im_end|>")],
    ids=["chatml-smollm2", "llama3", "qwen2.5"],
)
def test_masked_tokens_are_assistant_content_plus_end_of_turn(make_tok: Any, eot: str) -> None:
    tok = make_tok()
    ids, mask = mask_for(tok)
    assert masked_segments(tok, ids, mask) == [
        "Hello! How are you doing today?" + eot,
        "The capital of France is Paris." + eot,
    ]
    # the rendered text round-trips, so nothing outside the spans was lost or invented
    assert tok.decode(ids.tolist()) == tok.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in CONV.messages], tokenize=False
    )


def test_llama3_trims_content_and_mask_follows_the_template() -> None:
    tok = llama3_tokenizer()
    conv = Conversation("t", (Message("user", "hi"), Message("assistant", "  padded answer \n")))
    ids, mask = mask_for(tok, conv)
    assert masked_segments(tok, ids, mask) == ["padded answer<|eot_id|>"]
    assert tok.decode(ids[:1].tolist()) == "<|begin_of_text|>" and not mask[0]


def test_qwen3_history_rendered_differently_still_masks_each_turn() -> None:
    # Qwen3 renders the last assistant turn with an (empty) think block the model generates,
    # and earlier turns without it: the prefix of the whole conversation is not the whole of a prefix.
    tok = qwen3_tokenizer()
    ids, mask = mask_for(tok)
    assert masked_segments(tok, ids, mask) == [
        "Hello! How are you doing today?<|im_end|>",
        "<think>\n\n</think>\n\nThe capital of France is Paris.<|im_end|>",
    ]


def test_qwen3_reasoning_in_earlier_turn_is_dropped_by_template() -> None:
    tok = qwen3_tokenizer()
    conv = Conversation(
        "r",
        (
            Message("user", "Hello there!"),
            Message("assistant", "<think>\nhmm\n</think>\n\nHello!"),
            Message("user", "Bye"),
            Message("assistant", "Bye!"),
        ),
    )
    ids, mask = mask_for(tok, conv)
    assert masked_segments(tok, ids, mask) == ["Hello!<|im_end|>", "<think>\n\n</think>\n\nBye!<|im_end|>"]


def test_truncation_is_counted() -> None:
    tok = tiny_tokenizer()
    full_ids, _ = mask_for(tok)
    r = tokenize_conversation(tok, CONV, resolve_chat_template(tok), max_length=20)
    assert r.input_ids.numel() == 20 and r.truncated_tokens == full_ids.numel() - 20


def test_no_chat_template_is_a_clear_error_and_override_works(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(
        tokenizer_object=tiny_tokenizer().backend_tokenizer, eos_token="<|im_end|>"
    )
    bare.chat_template = None
    with pytest.raises(ConfigError, match="has no chat template") as e:
        resolve_chat_template(bare)
    assert "--chat-template" in str(e.value)
    path = tmp_path / "chatml.jinja"
    path.write_text(tiny_tokenizer().chat_template)
    template = resolve_chat_template(bare, path)
    r = tokenize_conversation(bare, CONV, template)
    assert masked_segments(bare, r.input_ids, r.loss_mask)[0] == "Hello! How are you doing today?<|im_end|>"
    with pytest.raises(ConfigError, match="not a file and not template text"):
        resolve_chat_template(bare, tmp_path / "missing.jinja")


def test_mask_from_offsets_token_starting_inside_span() -> None:
    offsets = [(0, 3), (3, 5), (5, 9), (9, 12)]
    assert mask_from_offsets(offsets, [(3, 9)]).tolist() == [False, True, True, False]
    assert mask_from_offsets(offsets, [(4, 6), (9, 10)]).tolist() == [False, False, True, True]
    assert mask_from_offsets([], [(0, 1)]).shape == (0,)
    assert mask_from_offsets(offsets, []).tolist() == [False] * 4


def scan_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """The left-to-right scan the vectorized mask must equal."""
    out, j = [], 0
    for s, _e in offsets:
        while j < len(spans) and s >= spans[j][1]:
            j += 1
        out.append(j < len(spans) and spans[j][0] <= s < spans[j][1])
    return out


def test_mask_from_offsets_equals_a_left_to_right_scan() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        T, S = (int(x) for x in torch.randint(0, 40, (2,), generator=gen))
        starts = torch.randint(0, 120, (T,), generator=gen)
        if int(torch.randint(0, 2, (1,), generator=gen)):
            starts = starts.sort().values  # real offsets mostly increase; these also step back
        offsets = [(int(s), int(s) + 1) for s in starts]
        cuts = sorted(set(torch.randint(0, 120, (2 * S,), generator=gen).tolist()))
        spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False)]  # in order, disjoint
        assert mask_from_offsets(offsets, spans).tolist() == scan_mask(offsets, spans), (offsets, spans)


@pytest.mark.parametrize(
    ("make_tok", "prefix"),
    [
        (tiny_tokenizer, "<|im_start|>user\n"),
        (llama3_tokenizer, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"),
        (
            qwen25_tokenizer,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n",
        ),
    ],
)
def test_user_turn_prefix(make_tok: Any, prefix: str) -> None:
    tok = make_tok()
    assert user_turn_prefix(tok, resolve_chat_template(tok)) == prefix


def reference_tokenize(tok: Any, conv: Conversation, template: str, max_length: int | None) -> Tokenized:
    """One conversation, one tokenizer call, the scan mask: what the batched path must reproduce."""
    text, spans = assistant_spans(tok, to_chat_messages(conv), template, where=conv.record_id)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor(enc["input_ids"], dtype=torch.long)
    mask = torch.tensor(scan_mask([tuple(o) for o in enc["offset_mapping"]], spans), dtype=torch.bool)
    cut = max(0, ids.numel() - max_length) if max_length is not None else 0
    if cut:
        ids, mask = ids[:max_length], mask[:max_length]
    return Tokenized(ids, mask, cut)


BATCH = [
    CONV,
    Conversation("empty", ()),  # the template cannot render it: a DataFormatError in its place
    Conversation("one", (Message("user", "def add(a, b):"), Message("assistant", "    return a + b\n"))),
    Conversation(
        "long",
        tuple(
            Message(r, f"{t} {'The capital of France is Paris. ' * (k + 1)}")
            for k in range(4)
            for r, t in (("user", "Tell me."), ("assistant", "Sure."))
        ),
    ),
]


@pytest.mark.parametrize(
    "make_tok",
    [tiny_tokenizer, llama3_tokenizer, qwen25_tokenizer, qwen3_tokenizer],
    ids=["chatml-smollm2", "llama3", "qwen2.5", "qwen3"],
)
@pytest.mark.parametrize("max_length", [None, 24])
def test_batched_tokenization_equals_one_at_a_time(make_tok: Any, max_length: int | None) -> None:
    tok = make_tok()
    template = resolve_chat_template(tok)
    results = tokenize_conversations(tok, BATCH, template, max_length=max_length)
    assert len(results) == len(BATCH)
    for conv, got in zip(BATCH, results, strict=True):
        if conv.record_id == "empty":
            assert isinstance(got, DataFormatError) and "empty: the chat template failed" in str(got)
            with pytest.raises(DataFormatError, match="empty: the chat template failed"):
                tokenize_conversation(tok, conv, template, max_length=max_length)
            continue
        assert isinstance(got, Tokenized)
        for want in (
            reference_tokenize(tok, conv, template, max_length),
            tokenize_conversation(tok, conv, template, max_length=max_length),
        ):
            assert got.input_ids.dtype == want.input_ids.dtype and got.loss_mask.dtype == want.loss_mask.dtype
            assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.loss_mask, want.loss_mask)
            assert got.truncated_tokens == want.truncated_tokens
        assert bool(got.loss_mask.any()) or max_length is not None
    long = results[[c.record_id for c in BATCH].index("long")]
    assert isinstance(long, Tokenized) and (long.truncated_tokens > 0) == (max_length is not None)
    assert tokenize_conversations(tok, [], template) == []
