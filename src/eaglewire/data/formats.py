"""Conversation files: JSONL in OpenAI `messages`, ShareGPT `conversations` or plain `prompt` rows.

One row per line. Accepted shapes (the format is detected per row):

- OpenAI:   `{"id": ..., "messages": [{"role": "user", "content": "..."}, ...]}`
- ShareGPT: `{"id": ..., "conversations": [{"from": "human", "value": "..."}, ...]}`
- prompt:   `{"id": ..., "prompt": "...", "system": "..."}` (one user turn; `system` optional)

`id` is optional; without it a row's id is `<file name>:<line>`. Ids are the keys for
resuming regeneration and for held-out splits, so duplicates are an error.

Bad input: a line that is not valid JSON or UTF-8, or a row of no known shape, or a message
with an unknown role or a null (missing) content, is a `DataFormatError` naming the file and line;
with `skip_bad` it is skipped and counted instead. A UTF-8 byte-order mark opening the file is
accepted (one opening a later line is an error). Empty conversations (no non-empty message) are
always skipped and counted; so are conversations without an assistant turn when `require_assistant`
is set; messages whose text is empty or whitespace are dropped from the conversations kept, and
counted (`dropped_empty_messages`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from eaglewire.errors import DataFormatError

log = logging.getLogger(__name__)

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")

# Every spelling seen in the wild, mapped to the three roles eaglewire trains with.
ROLE_ALIASES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
}


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True)
class Conversation:
    """One conversation; `record_id` is stable across runs (resume and held-out splits use it)."""

    record_id: str
    messages: tuple[Message, ...]

    @property
    def has_assistant(self) -> bool:
        return any(m.role == "assistant" for m in self.messages)

    @property
    def user_turns(self) -> int:
        return sum(m.role == "user" for m in self.messages)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.record_id,
            "messages": [{"role": m.role, "content": m.content} for m in self.messages],
        }


@dataclass
class ReadStats:
    """What reading a file kept and skipped, by reason (written into dataset indexes)."""

    lines: int = 0
    blank_lines: int = 0
    records: int = 0
    skipped_malformed: int = 0
    skipped_empty: int = 0
    skipped_no_assistant: int = 0
    # messages without text (whitespace only) dropped from conversations that were kept
    dropped_empty_messages: int = 0
    skipped_examples: list[str] = field(default_factory=list)

    MAX_EXAMPLES = 5

    def note_skip(self, reason: str) -> None:
        if len(self.skipped_examples) < self.MAX_EXAMPLES:
            self.skipped_examples.append(reason)

    def merge(self, other: ReadStats) -> None:
        for name in (
            "lines",
            "blank_lines",
            "records",
            "skipped_malformed",
            "skipped_empty",
            "skipped_no_assistant",
            "dropped_empty_messages",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for ex in other.skipped_examples:
            self.note_skip(ex)

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "blank_lines": self.blank_lines,
            "records": self.records,
            "skipped_malformed": self.skipped_malformed,
            "skipped_empty": self.skipped_empty,
            "skipped_no_assistant": self.skipped_no_assistant,
            "dropped_empty_messages": self.dropped_empty_messages,
            "skipped_examples": list(self.skipped_examples),
        }


def _normalize_role(raw: Any, where: str) -> Role:
    if not isinstance(raw, str) or raw.strip().lower() not in ROLE_ALIASES:
        known = ", ".join(sorted(ROLE_ALIASES))
        raise DataFormatError(
            f"{where}: unknown role {raw!r} (known roles: {known})",
            fix="rename the role to user/assistant/system, or drop the message",
        )
    return ROLE_ALIASES[raw.strip().lower()]


def _content_text(raw: Any, where: str) -> str:
    """Plain string content, or OpenAI's list of `{"type": "text", "text": ...}` parts. A null (or
    missing) content is malformed: dropping the message would silently turn the conversation into
    another one (an answer without its question)."""
    if isinstance(raw, str):
        return raw
    if raw is None:
        raise DataFormatError(
            f"{where}: the message has no content (null or missing)",
            fix="give the message its text or delete the message, or pass --skip-bad to skip (and count) "
            "such lines",
        )
    if isinstance(raw, list):
        parts = []
        for i, part in enumerate(raw):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise DataFormatError(
                    f"{where}.content[{i}]: only text parts are supported, got {part!r:.80}"
                )
        return "".join(parts)
    raise DataFormatError(f"{where}.content: expected a string, got {type(raw).__name__}")


def _messages_from_list(items: Any, *, role_key: str, content_key: str, where: str) -> list[Message]:
    if not isinstance(items, list):
        raise DataFormatError(f"{where}: expected a list of messages, got {type(items).__name__}")
    out = []
    for i, item in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise DataFormatError(
                f"{w}: expected an object with {role_key!r} and {content_key!r}, got {item!r:.80}"
            )
        if role_key not in item:
            raise DataFormatError(f"{w}: missing {role_key!r} (keys: {sorted(item)})")
        role = _normalize_role(item[role_key], w)
        out.append(Message(role, _content_text(item.get(content_key), f"{w} ({role}).{content_key}")))
    return out


def parse_row(row: Any, *, where: str) -> tuple[str | None, list[Message]]:
    """One JSON row -> (explicit id or None, messages). Raises DataFormatError naming `where`."""
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    rid = row.get("id")
    if rid is not None and not isinstance(rid, str | int):
        raise DataFormatError(f"{where}: 'id' must be a string or integer, got {rid!r:.80}")
    if "messages" in row:
        msgs = _messages_from_list(
            row["messages"], role_key="role", content_key="content", where=f"{where}: messages"
        )
    elif "conversations" in row:
        msgs = _messages_from_list(
            row["conversations"], role_key="from", content_key="value", where=f"{where}: conversations"
        )
    elif "prompt" in row:
        if not isinstance(row["prompt"], str):
            raise DataFormatError(f"{where}: 'prompt' must be a string, got {type(row['prompt']).__name__}")
        msgs = []
        if isinstance(row.get("system"), str) and row["system"].strip():
            msgs.append(Message("system", row["system"]))
        msgs.append(Message("user", row["prompt"]))
    else:
        raise DataFormatError(
            f"{where}: row has none of 'messages' (OpenAI), 'conversations' (ShareGPT) or 'prompt'; keys: {sorted(row)}"
        )
    return (None if rid is None else str(rid)), msgs


def _iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        yield from enumerate(f, start=1)


UTF8_BOM = b"\xef\xbb\xbf"


def _decode(raw: bytes, where: str, *, first_line: bool = False) -> str:
    """One line as text. A UTF-8 byte-order mark opening the file (editors on Windows write one) is
    not part of the data; one at the start of a later line (files concatenated) is named as such."""
    if raw.startswith(UTF8_BOM):
        if not first_line:
            raise DataFormatError(
                f"{where}: the line starts with a UTF-8 byte-order mark (bytes EF BB BF), which only a "
                "file's first line may carry (were files concatenated?)",
                fix="remove the 3 bytes EF BB BF at the start of that line, or pass --skip-bad",
            )
        raw = raw[len(UTF8_BOM) :]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFormatError(
            f"{where}: invalid UTF-8 at byte {e.start} of the line ({raw[max(0, e.start - 8) : e.start + 8]!r})",
            fix="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or pass --skip-bad",
        ) from None


def read_conversations(
    path: Path, *, require_assistant: bool = False, skip_bad: bool = False, limit: int | None = None
) -> tuple[list[Conversation], ReadStats]:
    """Read a JSONL file of conversations (see module docstring for the accepted shapes)."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such file")
    stats = ReadStats()
    out: list[Conversation] = []
    seen: dict[str, int] = {}
    for lineno, raw in _iter_lines(path):
        stats.lines += 1
        where = f"{path}:{lineno}"
        try:
            text = _decode(raw, where, first_line=lineno == 1)
            if not text.strip():
                stats.blank_lines += 1
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataFormatError(
                    f"{where}: invalid JSON at column {e.colno} ({e.msg})",
                    fix="fix or delete the line, or pass --skip-bad",
                ) from None
            rid, msgs = parse_row(row, where=where)
        except DataFormatError as e:
            if not skip_bad:
                raise
            stats.skipped_malformed += 1
            stats.note_skip(str(e).splitlines()[0])
            continue
        record_id = rid if rid is not None else f"{path.name}:{lineno}"
        if record_id in seen:
            raise DataFormatError(
                f"{where}: duplicate id {record_id!r} (first at line {seen[record_id]})",
                fix="make ids unique; resume and held-out splits are keyed by id",
            )
        seen[record_id] = lineno
        kept = [m for m in msgs if m.content.strip()]
        if not any(m.role != "system" for m in kept):
            stats.skipped_empty += 1
            stats.note_skip(f"{where}: empty conversation")
            continue
        conv = Conversation(record_id, tuple(kept))
        if require_assistant and not conv.has_assistant:
            stats.skipped_no_assistant += 1
            stats.note_skip(f"{where}: no assistant turn")
            continue
        if len(kept) < len(msgs):
            stats.dropped_empty_messages += len(msgs) - len(kept)
            stats.note_skip(f"{where}: {len(msgs) - len(kept)} message(s) without text dropped")
        out.append(conv)
        stats.records += 1
        if limit is not None and len(out) >= limit:
            break
    if (
        stats.skipped_malformed
        or stats.skipped_empty
        or stats.skipped_no_assistant
        or stats.dropped_empty_messages
    ):
        log.info(
            "%s: kept %d conversations; skipped %d malformed, %d empty, %d without an assistant turn; "
            "dropped %d messages without text from kept conversations",
            path,
            stats.records,
            stats.skipped_malformed,
            stats.skipped_empty,
            stats.skipped_no_assistant,
            stats.dropped_empty_messages,
        )
    return out, stats


def filter_conversations(
    convs: list[Conversation], *, require_assistant: bool
) -> tuple[list[Conversation], ReadStats]:
    """Apply the same empty / assistant-less rules to in-memory conversations (built-in sets)."""
    stats = ReadStats()
    out = []
    for c in convs:
        stats.lines += 1
        msgs = tuple(m for m in c.messages if m.content.strip())
        if not any(m.role != "system" for m in msgs):
            stats.skipped_empty += 1
            continue
        dropped = len(c.messages) - len(msgs)
        c = Conversation(c.record_id, msgs)
        if require_assistant and not c.has_assistant:
            stats.skipped_no_assistant += 1
            continue
        stats.dropped_empty_messages += dropped
        out.append(c)
        stats.records += 1
    return out, stats


def first_user_turns(conv: Conversation, turns: int) -> Conversation:
    """Keep the conversation up to (not including) its (turns+1)-th user message."""
    kept, seen = [], 0
    for m in conv.messages:
        if m.role == "user":
            if seen == turns:
                break
            seen += 1
        kept.append(m)
    return replace(conv, messages=tuple(kept))


def to_chat_messages(conv: Conversation) -> list[dict[str, str]]:
    """The list of `{"role", "content"}` dicts `apply_chat_template` takes."""
    return [{"role": m.role, "content": m.content} for m in conv.messages]
