"""Long training records: the built-in sets `long-chat` and `long-docs`, made from eaglewire.data.long_sources
(the long-1k..8k prompt sets are made from its 'eval' split; training takes the 'train' split).

- long-chat: consecutive chitchat conversations of the split joined into one (`joined_conversations`,
  JOIN_MIN_CHARS characters of content each: about 4,000 SmolLM2 tokens with the set's own answers), every
  turn kept, multi-turn; regeneration answers every user turn in order, the target seeing its own earlier
  answers. Id: `chitchat-joined:<uuid>+<uuid>+...`, the uuids of its chitchat conversations in order
  (`joined_record_id`), so `heldout_split` tells its split from the id alone: 'eval' when any source is.
- long-docs: one record per pysource file of the split with at least MIN_DOC_FILE_CHARS characters (license
  header dropped), id `pysource:transformers/<path>` (the file's). A user turn only: the target writes the
  answer (regeneration). Built without regeneration it has no assistant turn, and `data build` keeps none
  of it. The id decides (`stable_bucket` of the id plus a salt) its kind, its length and its instruction:
  - code: the file's start in a Python block, then an instruction of CODE_INSTRUCTIONS (an explanation, a
    summary, a docstring or a walk-through of a public function complete in the excerpt, tests to write);
  - document: files with an odd bucket and MIN_DOC_CHARS of docstrings (`docstring_sections`): those
    sections as `## <title>` blocks, then a question of DOC_QUESTIONS (an argument's meaning, a summary,
    what a class or function is for);
  the material is cut at a line to between MIN_LENGTH_FRACTION and all of `max_chars` characters, spread
  by the id, so that the answers sit at every distance from the start of the context.
"""

from __future__ import annotations

import functools
import re

from eaglewire.data.builtin import (
    JOINED_PREFIX,
    JOINED_SEPARATOR,
    LONG_SETS,
    Split,
    stable_bucket,
)
from eaglewire.data.formats import Conversation, Message
from eaglewire.data.long_sources import (
    SourceFile,
    docstring_sections,
    joined_conversations,
    pysource_files,
)
from eaglewire.errors import ConfigError

JOIN_MIN_CHARS = 16_000  # characters of content per joined conversation (about 4k SmolLM2 tokens)
DOC_MAX_CHARS = 24_000  # long-docs' default: about 7k SmolLM2 tokens of code (3.3-3.9 characters a token)
MIN_DOC_FILE_CHARS = 3_000  # shorter files are no long document
MIN_DOC_CHARS = 2_000  # a file with fewer characters of docstrings is a code record
MIN_LENGTH_FRACTION = 0.25
CODE_BLOCK = "```python\n{code}```\n\n{instruction}"
CODE_INSTRUCTIONS = (
    "The code above is the start of `{path}`. Explain what this module does and list its public classes.",
    "Summarize what the code above does, part by part.",
    "Write a docstring for `{name}` in the code above: what it does, its arguments and what it returns.",
    "Explain step by step how `{name}` in the code above works.",
    "Which parts of the code above would you test first, and what should those tests check?",
)
DOCUMENT = (
    "Below is reference documentation from the `transformers` library (`{path}`).\n\n{document}\n\n"
    "Question: {question}"
)
DOC_QUESTIONS = (
    "In the documentation above, what does the `{arg}` argument of `{title}` do?",
    "Summarize the documentation above in a few paragraphs.",
    "According to the documentation above, what is `{title}` for, and how is it used?",
)
_ARG = re.compile(r"^\s*(\w+) \(`[^`]*`[^)\n]*\):\s*$", re.MULTILINE)
_DEF = re.compile(r"^( *)def (\w+)\(", re.MULTILINE)
_CLASS = re.compile(r"^class (\w+)", re.MULTILINE)


def joined_record_id(source_ids: tuple[str, ...] | list[str]) -> str:
    """['chitchat:<a>', 'chitchat:<b>'] -> 'chitchat-joined:<a>+<b>' (`builtin.joined_source_ids` reads it)."""
    uuids = []
    for source in source_ids:
        uuid = source.removeprefix("chitchat:")
        if uuid == source or not uuid or JOINED_SEPARATOR in uuid:
            raise ConfigError(
                f"joined conversation source {source!r}: expected 'chitchat:<uuid>' without {JOINED_SEPARATOR!r}"
            )
        uuids.append(uuid)
    if not uuids:
        raise ConfigError("joined conversation: expected at least one source id, got none")
    return JOINED_PREFIX + JOINED_SEPARATOR.join(uuids)


def long_chat(split: Split, min_chars: int = JOIN_MIN_CHARS) -> list[Conversation]:
    """The joined chitchat conversations of `split` (every turn), in file order."""
    return list(_long_chat(split, min_chars))


@functools.lru_cache(maxsize=4)
def _long_chat(split: Split, min_chars: int) -> tuple[Conversation, ...]:
    joined = joined_conversations(split, min_chars)
    return tuple(Conversation(joined_record_id(j.source_ids), j.messages) for j in joined)


def _salted(record_id: str, salt: str) -> int:
    return stable_bucket(f"{record_id}#{salt}")


def cut_chars(record_id: str, max_chars: int) -> int:
    """The characters of material record `record_id` gets: MIN_LENGTH_FRACTION..1 of `max_chars`, by its id."""
    fraction = MIN_LENGTH_FRACTION + (1 - MIN_LENGTH_FRACTION) * _salted(record_id, "length") / 99
    return int(max_chars * fraction)


def cut_at_line(text: str, chars: int) -> str:
    """The longest start of `text` of whole lines within `chars` characters (all of it when shorter)."""
    if len(text) <= chars:
        return text
    end = text.rfind("\n", 0, chars + 1)
    return text[: end + 1] if end > 0 else text[:chars]


def complete_functions(excerpt: str) -> list[str]:
    """Public functions and methods ('Class.method') of `excerpt` that end inside it: every `def` but the
    last (which the cut may split), in order."""
    out = []
    defs = list(_DEF.finditer(excerpt))
    for m in defs[:-1]:
        if m.group(2).startswith("_"):
            continue
        classes = [c.group(1) for c in _CLASS.finditer(excerpt, 0, m.start())]
        out.append(f"{classes[-1]}.{m.group(2)}" if m.group(1) and classes else m.group(2))
    return out


def code_prompt(source: SourceFile, text: str, max_chars: int) -> str:
    """The start of `text` (source's file) in a Python block with its instruction."""
    rid, path = source.record_id, source.record_id.split(":", 1)[1]
    excerpt = cut_at_line(text, cut_chars(rid, max_chars))
    names = complete_functions(excerpt)
    template = CODE_INSTRUCTIONS[_salted(rid, "instruction") % len(CODE_INSTRUCTIONS)]
    if "{name}" in template and not names:
        template = CODE_INSTRUCTIONS[0]
    name = names[_salted(rid, "name") % len(names)] if names else ""
    return CODE_BLOCK.format(code=excerpt, instruction=template.format(path=path, name=name))


def document_prompt(source: SourceFile, max_chars: int) -> str | None:
    """The docstrings of `source` as a document with its question; None when they are too few."""
    blocks = [(s.title, f"## {s.title}\n\n{s.text}\n\n") for s in docstring_sections(source)]
    if sum(len(b) for _, b in blocks) < MIN_DOC_CHARS:
        return None
    rid, path = source.record_id, source.record_id.split(":", 1)[1]
    budget = cut_chars(rid, max_chars)
    parts: list[tuple[str, str]] = []  # (section title, its text in the document)
    for title, block in blocks:
        left = budget - sum(len(text) for _, text in parts)
        if len(block) > left:
            parts.append((title, cut_at_line(block, left)))
            break
        parts.append((title, block))
    document = "".join(text for _, text in parts).rstrip()
    args = [(title, m.group(1)) for title, text in parts for m in _ARG.finditer(text)]
    template = DOC_QUESTIONS[_salted(rid, "instruction") % len(DOC_QUESTIONS)]
    if "{arg}" in template and not args:
        template = DOC_QUESTIONS[1]
    title, arg = args[_salted(rid, "arg") % len(args)] if "{arg}" in template else (parts[0][0], "")
    question = template.format(arg=arg, title=title)
    return DOCUMENT.format(path=path, document=document, question=question)


def long_docs(split: Split, max_chars: int = DOC_MAX_CHARS, limit: int | None = None) -> list[Conversation]:
    """User turns on the pysource files of `split` (sorted by id), the first `limit` when given; see the
    module docstring."""
    if max_chars < 1:
        raise ConfigError(f"max_chars: expected >= 1, got {max_chars}")
    out: list[Conversation] = []
    for source in pysource_files(split):
        if limit is not None and len(out) >= limit:
            break
        text = source.text()
        if len(text) < MIN_DOC_FILE_CHARS:
            continue
        prompt = document_prompt(source, max_chars) if stable_bucket(source.record_id) % 2 else None
        prompt = prompt or code_prompt(source, text, max_chars)
        out.append(Conversation(source.record_id, (Message("user", prompt),)))
    return out


def load_long_set(name: str, split: Split) -> list[Conversation]:
    """Built-in set `long-chat` or `long-docs` of `split`, at its default sizes."""
    if name == "long-chat":
        return long_chat(split)
    if name == "long-docs":
        return long_docs(split)
    raise ConfigError(f"long training set: expected one of {', '.join(LONG_SETS)}, got {name!r}")
