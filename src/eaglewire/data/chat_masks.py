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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        through = render(tokenizer, messages[: i + 1], template, add_generation_prompt=False)
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


def mask_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> torch.Tensor:
    """[T] bool: True for each token whose first character lies inside a span."""
    mask = torch.zeros(len(offsets), dtype=torch.bool)
    j = 0
    for k, (s, _e) in enumerate(offsets):
        while j < len(spans) and s >= spans[j][1]:
            j += 1
        if j < len(spans) and spans[j][0] <= s < spans[j][1]:
            mask[k] = True
    return mask


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


def tokenize_conversation(
    tokenizer: Any, conv: Conversation, template: str, *, max_length: int | None = None
) -> Tokenized:
    """Render `conv`, tokenize, mask assistant tokens; truncate to `max_length` tokens."""
    require_fast(tokenizer)
    text, spans = assistant_spans(tokenizer, to_chat_messages(conv), template, where=conv.record_id)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor(enc["input_ids"], dtype=torch.long)
    mask = mask_from_offsets([tuple(o) for o in enc["offset_mapping"]], spans)
    cut = 0
    if max_length is not None and ids.numel() > max_length:
        cut = ids.numel() - max_length
        ids, mask = ids[:max_length], mask[:max_length]
    return Tokenized(input_ids=ids, loss_mask=mask, truncated_tokens=cut)


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
