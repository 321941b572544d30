"""Render conversations with the tokenizer's chat template; loss mask on assistant tokens only.

The mask comes from CHARACTER OFFSETS, never from token counts: the conversation is rendered
once; each assistant message's span in that text is found by rendering prefixes (the
conversation up to the message with the generation prompt -> where the answer starts; up to
and including the message -> where its turn ends); the fast tokenizer's `offset_mapping`
then marks every token that starts inside a span. The span is the assistant's content plus
the end-of-turn text the template writes after it (`<|im_end|>`, `<|eot_id|>`), without the
trailing newline (the model never generates it). Text the template inserts between the
generation prompt and the content (Qwen3's `<think>\n\n</think>\n\n` in the last turn) is
part of the span: the model generates it.

When a template renders history differently from a prefix (Qwen3 strips reasoning from
earlier turns), the content is located in the full text instead, after the previous span.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eaglewire.data.formats import Conversation, to_chat_messages
from eaglewire.errors import ConfigError, DataFormatError

log = logging.getLogger(__name__)


def resolve_chat_template(tokenizer: Any, override: str | Path | None = None) -> str:
    """The template text: `override` (a Jinja file path or the template text itself), else the tokenizer's."""
    if override is not None:
        text = str(override)
        if "{%" in text or "{{" in text:
            return text
        path = Path(text).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"--chat-template {text!r}: not a file and not template text (no '{{%' or '{{{{')",
                fix="pass a path to a .jinja file or the template text",
            )
        return path.read_text(encoding="utf-8")
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: use the default one
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"tokenizer {name!r} has no chat template, so conversations cannot be rendered the way the target "
            "sees them when serving",
            fix="pass --chat-template PATH with the Jinja template the target is served with "
            "(e.g. the chat_template of its instruct variant)",
        )
    return template


def render(
    tokenizer: Any, messages: list[dict[str, str]], template: str, *, add_generation_prompt: bool
) -> str:
    out = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(out, str):
        raise TypeError(f"apply_chat_template returned {type(out).__name__}, expected str")
    return out


def _trim_trailing_space(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1].isspace():
        end -= 1
    return end


def _end_of_turn_token(tokenizer: Any, through: str) -> str | None:
    """The special token a rendering of an assistant turn ends with (`<|im_end|>`, `<|eot_id|>`), if any."""
    tail = through.rstrip()
    specials = sorted(getattr(tokenizer, "all_special_tokens", []), key=len, reverse=True)
    return next((t for t in specials if t and tail.endswith(t)), None)


def _fallback_span(
    tokenizer: Any, full: str, through: str, content: str, prefix: str | None, cursor: int
) -> tuple[int, int]:
    """Span of an assistant turn the template renders differently in history than at the end.

    Start: where the generation prompt ends (when the prefix is consistent), else where the
    content is found. End: the turn's end-of-turn token after the start, else the content's end
    plus whatever the template writes after the content. (-1, -1) when neither can be found.
    """
    key = content.strip()
    start = len(prefix) if prefix is not None else (full.find(key, cursor) if key else -1)
    if start < 0:
        return -1, -1
    eot = _end_of_turn_token(tokenizer, through)
    if eot is not None:
        pos = full.find(eot, start)
        if pos >= 0:
            return start, pos + len(eot)
    pos = full.find(key, start) if key else -1
    if pos < 0:
        return -1, -1
    end = pos + len(key)
    k = through.rfind(key)
    suffix = through[k + len(key) :].rstrip() if k >= 0 else ""
    if suffix and full.startswith(suffix, end):
        end += len(suffix)
    return start, end


def assistant_spans(
    tokenizer: Any, messages: list[dict[str, str]], template: str, *, where: str = ""
) -> tuple[str, list[tuple[int, int]]]:
    """Rendered text and one [start, end) character span per assistant message, in order."""
    try:
        full = render(tokenizer, messages, template, add_generation_prompt=False)
    except Exception as e:  # noqa: BLE001 - jinja raises many types (TemplateError, TypeError, IndexError)
        raise DataFormatError(f"{where}: the chat template failed to render this conversation: {e}") from None
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prefix = None
        if i > 0:
            try:
                prefix = render(tokenizer, messages[:i], template, add_generation_prompt=True)
            except Exception:  # noqa: BLE001 - some templates refuse partial conversations
                prefix = None
        if i + 1 == len(messages):  # the conversation through its last message is `full`
            through = full
        else:
            try:
                through = render(tokenizer, messages[: i + 1], template, add_generation_prompt=False)
            except Exception as e:  # noqa: BLE001 - jinja raises many types
                raise DataFormatError(
                    f"{where}: the chat template failed to render this conversation through assistant "
                    f"message {i}: {e}"
                ) from None
        prefix_ok = prefix is not None and full.startswith(prefix) and len(prefix) >= cursor
        if prefix_ok and full.startswith(through) and len(through) > len(prefix or ""):
            start = len(prefix or "")
            end = _trim_trailing_space(full, start, len(through))
        else:
            start, end = _fallback_span(
                tokenizer, full, through, msg["content"], prefix if prefix_ok else None, cursor
            )
            if start < 0:
                raise DataFormatError(
                    f"{where}: assistant message {i} ({msg['content'].strip()[:40]!r}) cannot be located in the "
                    "rendered conversation; the template rewrites it and its turn has no end-of-turn token",
                    fix="pass a --chat-template that renders assistant content verbatim",
                )
        if start < cursor or end <= start:
            raise DataFormatError(
                f"{where}: assistant message {i} maps to an empty or out-of-order span [{start}, {end})"
            )
        spans.append((start, end))
        cursor = end
    return full, spans


def mask_from_offsets(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[T] bool: True for each token whose first character lies inside a span.

    `spans` are in order and disjoint, as `assistant_spans` returns them. Each token is checked
    against the first span that ends after the furthest token start seen so far (what a
    left-to-right scan does), so a token whose offsets step back is never matched to an earlier span.
    """
    starts = np.array([o[0] for o in offsets], dtype=np.int64)  # [T]
    if not spans or starts.size == 0:
        return torch.zeros(starts.size, dtype=torch.bool)
    bounds = np.array(spans, dtype=np.int64).reshape(-1, 2)  # [S, 2]
    reach = np.maximum.accumulate(starts)  # [T] furthest start so far
    j = np.searchsorted(bounds[:, 1], reach, side="right")  # [T] first span ending after reach
    inside = j < len(bounds)
    jc = np.minimum(j, len(bounds) - 1)
    inside &= (bounds[jc, 0] <= starts) & (starts < bounds[jc, 1])
    return torch.from_numpy(inside)


@dataclass
class Tokenized:
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool
    truncated_tokens: int  # tokens cut by max_length


def require_fast(tokenizer: Any) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"tokenizer {type(tokenizer).__name__} is not a fast (Rust) tokenizer; assistant masks need its "
            "character offsets",
            fix="load the tokenizer with use_fast=True (a tokenizer.json in the target directory)",
        )


def _to_tokenized(
    ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]], max_length: int | None
) -> Tokenized:
    """One encoded text -> tensors, its assistant mask, truncated to `max_length` tokens."""
    input_ids = torch.from_numpy(np.array(ids, dtype=np.int64))  # [T]
    mask = mask_from_offsets(offsets, spans)  # [T]
    cut = 0
    if max_length is not None and input_ids.numel() > max_length:
        cut = input_ids.numel() - max_length
        input_ids, mask = input_ids[:max_length], mask[:max_length]
    return Tokenized(input_ids=input_ids, loss_mask=mask, truncated_tokens=cut)


def tokenize_conversations(
    tokenizer: Any, convs: Sequence[Conversation], template: str, *, max_length: int | None = None
) -> list[Tokenized | DataFormatError]:
    """`tokenize_conversation` for each of `convs`, with one (parallel, Rust) tokenizer call for all.

    A conversation the template cannot render or mask gets its `DataFormatError` in its place
    (the caller decides whether to raise or skip); the others are rendered, tokenized and
    masked exactly as one at a time.
    """
    if not convs:
        return []
    require_fast(tokenizer)
    rendered: list[tuple[str, list[tuple[int, int]]] | DataFormatError] = []
    for conv in convs:
        try:
            rendered.append(
                assistant_spans(tokenizer, to_chat_messages(conv), template, where=conv.record_id)
            )
        except DataFormatError as e:
            rendered.append(e)
    texts = [r[0] for r in rendered if not isinstance(r, DataFormatError)]
    enc = (
        tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        if texts
        else {"input_ids": [], "offset_mapping": []}
    )
    encoded = zip(enc["input_ids"], enc["offset_mapping"], strict=True)  # one per rendered text
    out: list[Tokenized | DataFormatError] = []
    for r in rendered:
        if isinstance(r, DataFormatError):
            out.append(r)
            continue
        ids, offsets = next(encoded)
        out.append(_to_tokenized(ids, offsets, r[1], max_length))
    return out


def tokenize_conversation(
    tokenizer: Any, conv: Conversation, template: str, *, max_length: int | None = None
) -> Tokenized:
    """Render `conv`, tokenize, mask assistant tokens; truncate to `max_length` tokens."""
    (result,) = tokenize_conversations(tokenizer, [conv], template, max_length=max_length)
    if isinstance(result, DataFormatError):
        raise result
    return result


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]], template: str) -> list[int]:
    """Token ids of `messages` rendered with the generation prompt (what the target answers)."""
    text = render(tokenizer, messages, template, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def user_turn_prefix(tokenizer: Any, template: str) -> str:
    """The text a template writes before a user message's content (Magpie's prompt).

    Rendered with a sentinel user message and cut at the sentinel; includes any default system
    prompt the template adds.
    """
    sentinel = "\x00EAGLEWIRE_SENTINEL\x00"
    text = render(tokenizer, [{"role": "user", "content": sentinel}], template, add_generation_prompt=False)
    pos = text.find(sentinel)
    if pos < 0:
        raise ConfigError(
            "the chat template does not render user content verbatim; no Magpie prefix can be taken"
        )
    return text[:pos]
