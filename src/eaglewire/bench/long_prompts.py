"""The long-context benchmark prompt sets `long-1k`, `long-2k`, `long-4k` and `long-8k`: held out, built
offline from eval material of eaglewire.data.long_sources, sized without a tokenizer.

Each set has PROMPTS_PER_KIND prompts of each kind, interleaved (conversation-01, code-01, document-01,
conversation-02, ...) so that the first N prompts cover every kind:

- conversation: joined held-out chitchat conversations (every turn kept, multi-turn), cut after the
  user turn that brings the prompt nearest its length; the target answers that turn.
- code: the start of a held-out model's `modeling_*.py` file (license header dropped) in a Python
  block, then an instruction: odd numbers "explain this module and list its public classes", even
  numbers "write a docstring for <the longest public function complete in the excerpt>".
- document: docstrings of held-out model directories as one reference document, then a question on
  an argument documented in its first sections (the answer lies at the far end of the context).

Prompt `nn` of a kind uses the same material in every set (slot `nn`), so a longer set's prompt extends
the shorter one's: tau per length compares the same text. Sizing: estimated tokens = TEMPLATE_TOKENS +
per message (MESSAGE_TOKENS + `text_tokens(content)`), calibrated on SmolLM2's tokenizer (the reference
target; a test checks the real counts). The 8k set aims at CONTEXT_TOKENS - ANSWER_ROOM so that prompt
and answer fit SmolLM2's 8,192 positions. Ids: `long-context:<len>-<kind>-<nn>`.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass

from eaglewire.data.formats import Conversation
from eaglewire.data.long_sources import (
    DocSection,
    SourceFile,
    chitchat_dialogues,
    docstring_sections,
    join_dialogues,
    model_units,
    pysource_files,
    pysource_root,
)
from eaglewire.errors import ConfigError, DataFormatError

LONG_CONTEXT_LENGTHS = {"1k": 1024, "2k": 2048, "4k": 4096, "8k": 8192}
LONG_CONTEXT_PREFIX = "long-context:"
KINDS = ("conversation", "code", "document")
PROMPTS_PER_KIND = 4
# Tokens of a text estimated from its characters: runs of letters, other symbols, digits, newlines.
# Fitted on SmolLM2's tokenizer over this eval material: within 9% on every 12,000-character piece of
# code, conversation or docstrings, where one characters-per-token ratio (3.3 to 3.9 between code files)
# was off by up to 20%.
TOKENS_PER_WORD = 1.0
TOKENS_PER_SYMBOL = 0.9
TOKENS_PER_DIGIT = 0.9
TOKENS_PER_NEWLINE = 1.5
TEMPLATE_TOKENS = 25  # SmolLM2's default system message and the generation prompt
# `<|im_start|>role\n` ... `<|im_end|>\n` around a message: 5 for user, 6 for assistant, and about one
# more where its text starts without the space a word has inside a text (fitted: 6 over both roles)
MESSAGE_TOKENS = 6.0
CONTEXT_TOKENS = 8192  # SmolLM2's max_position_embeddings
ANSWER_ROOM = 512  # the bench's default 256 new tokens, plus draft tokens past them
MIN_CODE_CHARS = 30_000  # a code file this long fills the 8k set's prompt
CUT_SLACK = 0.03  # a cut may move back this fraction of its text, to fall between top-level lines
CODE_BLOCK = "```python\n{code}```\n\n{instruction}"
EXPLAIN = (
    "The code above is the start of `{path}`. Explain what this module does and list its public classes."
)
DOCSTRING = (
    "Write a docstring for `{name}` in the code above: what it does, its arguments and what it returns."
)
DOCUMENT = (
    "Below is reference documentation from the `transformers` library.\n\n{document}\n\nQuestion: {question}"
)
QUESTION = "In the documentation above, what does the `{arg}` argument of `{title}` do{default}?"
QUESTION_TOKENS = 40  # a question with a long argument and title
_WORD = re.compile(r"[^\W\d_]+")
_ARG = re.compile(r"^\s*(\w+) \(`[^`]*`[^)\n]*\):\s*$", re.MULTILINE)
_CONTINUATION = ("", " ", "\t", "\n", ")", "]", "}")  # how a line that is not top-level starts


@dataclass(frozen=True)
class LongPrompt:
    """One prompt: (role, content) messages ending with a user message (eaglewire.bench.prompts makes a
    BenchPrompt of it; this module does not import that one, which imports it)."""

    prompt_id: str  # long-context:<len>-<kind>-<nn>
    messages: tuple[tuple[str, str], ...]
    kind: str  # one of KINDS


def target_tokens(length: str) -> int:
    """Prompt tokens set `length` aims at: its nominal length, or less where the answer must fit."""
    return min(LONG_CONTEXT_LENGTHS[length], CONTEXT_TOKENS - ANSWER_ROOM)


def text_tokens(text: str) -> float:
    """Estimated tokens of `text` with SmolLM2's tokenizer, from counts of its characters."""
    words = len(_WORD.findall(text))
    digits = sum(c.isdigit() for c in text)
    symbols = sum(not (c.isalnum() or c.isspace()) for c in text)
    newlines = text.count("\n")
    return (
        TOKENS_PER_WORD * words
        + TOKENS_PER_SYMBOL * symbols
        + TOKENS_PER_DIGIT * digits
        + TOKENS_PER_NEWLINE * newlines
    )


def estimate_tokens(messages: tuple[tuple[str, str], ...]) -> float:
    """Tokens of `messages` after SmolLM2's chat template with the generation prompt (no tokenizer)."""
    return TEMPLATE_TOKENS + sum(MESSAGE_TOKENS + text_tokens(text) for _, text in messages)


def fit_lines(text: str, tokens: float) -> str:
    """The longest start of `text` of whole lines estimated at most `tokens`, ending before a top-level
    line when one starts in the last CUT_SLACK of it (a cut between definitions reads better)."""
    lines = text.splitlines(keepends=True)
    ends: list[int] = []  # ends[n]: characters of lines[: n + 1]
    total = 0.0
    for line in lines:
        total += text_tokens(line)
        if total > tokens:
            break
        ends.append((ends[-1] if ends else 0) + len(line))
    cut = ends[-1] if ends else 0
    for n in range(len(ends) - 1, 0, -1):
        if ends[n - 1] < (1 - CUT_SLACK) * cut:
            break
        if lines[n][:1] not in _CONTINUATION:
            return text[: ends[n - 1]]
    return text[:cut]


@functools.lru_cache(maxsize=1)
def _dialogue_slots() -> tuple[tuple[Conversation, ...], ...]:
    """Held-out dialogues in PROMPTS_PER_KIND contiguous, equal runs: slot i's joined conversation."""
    dialogues = chitchat_dialogues("eval")
    size = len(dialogues) // PROMPTS_PER_KIND
    return tuple(tuple(dialogues[i * size : (i + 1) * size]) for i in range(PROMPTS_PER_KIND))


def conversation_messages(slot: int, tokens: int) -> tuple[tuple[str, str], ...]:
    """The start of slot `slot`'s joined conversation that ends on a user turn and is estimated nearest
    `tokens` (a turn is short: a few dozen tokens either way)."""
    joined = join_dialogues(list(_dialogue_slots()[slot]))
    pairs = [(m.role, m.content) for m in joined.messages]
    best: tuple[float, int] | None = None  # (distance from `tokens`, messages)
    total = float(TEMPLATE_TOKENS)
    for i, (role, text) in enumerate(pairs):
        total += MESSAGE_TOKENS + text_tokens(text)
        if role == "user" and (best is None or abs(total - tokens) < best[0]):
            best = (abs(total - tokens), i + 1)
        if total > tokens and best is not None:
            return tuple(pairs[: best[1]])
    raise DataFormatError(
        f"long-context conversation slot {slot}: its held-out dialogues make {total:.0f} tokens, "
        f"expected more than {tokens}"
    )


@functools.lru_cache(maxsize=1)
def code_files() -> tuple[SourceFile, ...]:
    """One held-out model's `modeling_*.py` file per slot, evenly spaced among those long enough for 8k."""
    files = [f for f in pysource_files("eval", "modeling_") if "/models/" in f.record_id]
    long_enough = [f for f in files if len(f.text()) >= MIN_CODE_CHARS]
    if len(long_enough) < PROMPTS_PER_KIND:
        raise DataFormatError(
            f"{pysource_root()}: {len(long_enough)} held-out modeling files of {MIN_CODE_CHARS}+ characters, "
            f"expected at least {PROMPTS_PER_KIND}"
        )
    step = len(long_enough) // PROMPTS_PER_KIND
    return tuple(long_enough[i * step] for i in range(PROMPTS_PER_KIND))


def _functions(code: str) -> list[tuple[str, ast.FunctionDef]]:
    """('Class.method' or 'function', node) for module-level functions and methods of top-level classes."""
    out = []
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            out += [(f"{node.name}.{fn.name}", fn) for fn in node.body if isinstance(fn, ast.FunctionDef)]
    return out


def longest_function(code: str, excerpt_lines: int) -> str | None:
    """The longest public function (qualified name) that ends within the first `excerpt_lines` lines
    of `code`; None when none does."""
    found = [
        (fn.end_lineno - fn.lineno, name)
        for name, fn in _functions(code)
        if not fn.name.startswith("_") and fn.end_lineno is not None and fn.end_lineno <= excerpt_lines
    ]
    return max(found, key=lambda f: f[0])[1] if found else None  # max keeps the first of equals


def code_messages(slot: int, tokens: int) -> tuple[tuple[str, str], ...]:
    """Slot `slot`'s file, cut to fill `tokens`, with its instruction."""
    source = code_files()[slot]
    text = source.text()
    path = source.record_id.split(":", 1)[1]
    # sized with the longer instruction: a docstring request's name is at most 12 tokens
    instruction_tokens = max(text_tokens(EXPLAIN.format(path=path)), text_tokens(DOCSTRING) + 12)
    room = tokens - TEMPLATE_TOKENS - MESSAGE_TOKENS - text_tokens(CODE_BLOCK) - instruction_tokens
    excerpt = fit_lines(text, room)
    name = longest_function(text, excerpt.count("\n")) if slot % 2 else None  # nn = slot + 1 is even
    instruction = DOCSTRING.format(name=name) if name else EXPLAIN.format(path=path)
    return (("user", CODE_BLOCK.format(code=excerpt, instruction=instruction)),)


@functools.lru_cache(maxsize=PROMPTS_PER_KIND)
def document_sections(slot: int) -> tuple[DocSection, ...]:
    """Docstrings of the held-out model directories numbered slot, slot + 4, ... (sorted order): each
    directory's configuration files first, then its modeling files; a repeated docstring only once."""
    by_unit: dict[str, list[SourceFile]] = {}
    for source in pysource_files("eval"):
        by_unit.setdefault(source.record_id.split(":", 1)[1].rsplit("/", 1)[0], []).append(source)
    out: dict[str, DocSection] = {}  # by text: code copied between models repeats its docstrings
    for unit in model_units("eval")[slot::PROMPTS_PER_KIND]:
        for prefix in ("configuration_", "modeling_"):
            for source in by_unit.get(unit, []):
                if source.path.name.startswith(prefix):
                    out.update((s.text, s) for s in docstring_sections(source) if s.text not in out)
    return tuple(out.values())


def _question(parts: list[tuple[str, str]]) -> str:
    """A question on the first argument documented in the (title, text) `parts` of a document, in a
    configuration class where one documents any (functions copied between models repeat theirs)."""
    for title, text in sorted(parts, key=lambda p: not p[0].endswith("Config")):  # stable
        m = _ARG.search(text)
        if m:
            default = ", and what is its default value" if "defaults to" in m.group(0) else ""
            return QUESTION.format(arg=m.group(1), title=title, default=default)
    raise DataFormatError(f"long-context document of {len(parts)} sections: no documented argument")


def document_messages(slot: int, tokens: int) -> tuple[tuple[str, str], ...]:
    """Slot `slot`'s sections in order, the last one cut at a line, filling `tokens` with the question."""
    room = tokens - TEMPLATE_TOKENS - MESSAGE_TOKENS - text_tokens(DOCUMENT) - QUESTION_TOKENS
    parts: list[tuple[str, str]] = []  # (section title, its text in the document)
    for section in document_sections(slot):
        block = f"## {section.title}\n\n{section.text}\n\n"
        left = room - sum(text_tokens(text) for _, text in parts)
        if text_tokens(block) > left:
            parts.append((section.title, fit_lines(block, left)))  # whole lines, as for code
            document = "".join(text for _, text in parts).rstrip()
            return (("user", DOCUMENT.format(document=document, question=_question(parts))),)
        parts.append((section.title, block))
    raise DataFormatError(
        f"long-context document slot {slot}: its held-out docstrings make "
        f"{sum(text_tokens(text) for _, text in parts):.0f} tokens, expected more than {room:.0f}"
    )


_BUILDERS = {"conversation": conversation_messages, "code": code_messages, "document": document_messages}


def long_context_prompt(length: str, kind: str, slot: int) -> LongPrompt:
    """Prompt `slot` (0-based) of `kind` in set `long-<length>`."""
    messages = _BUILDERS[kind](slot, target_tokens(length))
    return LongPrompt(f"{LONG_CONTEXT_PREFIX}{length}-{kind}-{slot + 1:02d}", messages, kind)


def load_long_context(length: str) -> tuple[LongPrompt, ...]:
    """The prompts of set `long-<length>` ('1k', '2k', '4k' or '8k'), kinds interleaved."""
    if length not in LONG_CONTEXT_LENGTHS:
        raise ConfigError(
            f"long-context length: expected one of {', '.join(LONG_CONTEXT_LENGTHS)}, got {length!r}"
        )
    return tuple(
        long_context_prompt(length, kind, slot) for slot in range(PROMPTS_PER_KIND) for kind in KINDS
    )
