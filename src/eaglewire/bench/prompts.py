"""Benchmark prompt sets: JSONL files or built-in held-out sets, as chat messages up to the first user turn.

Built-in names (every one is evaluation-only, never trained on):

| name             | source                                                                   |
|------------------|--------------------------------------------------------------------------|
| `chitchat-eval`  | `eaglewire.data.builtin.load_builtin("chitchat", split="eval")`           |
| `humaneval-eval` | `eaglewire.data.builtin.load_builtin("humaneval", split="eval")`          |
| `mt-bench`       | first turns of the 80 MT-bench questions (package data, FastChat 0e6d3e4b) |
| `user-eval`      | 84 instructions written for eaglewire in MT-bench's 8 categories (package data) |
| `long-1k` .. `long-8k` | 12 prompts of about 1k / 2k / 4k / 8k tokens: joined conversations, code, documents (eaglewire.bench.long_prompts) |

`mt-bench` and `user-eval` are user-like; `chitchat-eval` and `humaneval-eval` are held out from the
training sets' own distribution, so their acceptance is higher than a user's prompts get. The `long-*`
sets (long-context held-out) give acceptance per prompt length; they keep every turn of a conversation.

A JSONL file holds one row per line, in any of these shapes (detected per row):
`{"prompt": "...", "system": "...", "category": "..."}`, OpenAI `{"messages": [...]}`, ShareGPT `{"conversations": [...]}`
(both cut after the first user message), or an MT-bench row `{"question_id", "category", "turns"}`
(its first turn). A prompt is the system messages before the first user message plus that message:
the benchmark measures the first answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from eaglewire.errors import ConfigError, DataFormatError

MT_BENCH_FILE = "mt_bench_questions.jsonl"
MT_BENCH_COUNT = 80
USER_EVAL_FILE = "user_eval.jsonl"
LONG_CONTEXT_PROMPT_SETS = ("long-1k", "long-2k", "long-4k", "long-8k")
BUILTIN_PROMPT_SETS = ("chitchat-eval", "humaneval-eval", "mt-bench", "user-eval", *LONG_CONTEXT_PROMPT_SETS)
# Prompts written like a user's, not drawn from any training set's distribution: reports list them first.
USER_LIKE_PROMPT_SETS = ("mt-bench", "user-eval")
# Held out of the training sets' own distribution: their acceptance overstates what a user's prompts get.
IN_DISTRIBUTION_PROMPT_SETS = ("chitchat-eval", "humaneval-eval")
USER_LIKE = "user-like"
IN_DISTRIBUTION = "in-distribution held-out"
LONG_CONTEXT = "long-context held-out"
_BUILTIN_DATA_SETS = {"chitchat-eval": "chitchat", "humaneval-eval": "humaneval"}


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: chat messages ({"role", "content"}) ending with a user message."""

    prompt_id: str
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs
    category: str = ""

    def chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    @property
    def text(self) -> str:
        """The user message (what a table shows)."""
        return self.messages[-1][1]


@dataclass(frozen=True)
class PromptSet:
    name: str  # built-in name or file path
    prompts: tuple[BenchPrompt, ...]

    def head(self, n: int | None) -> PromptSet:
        """The first `n` prompts (all when n is None or 0)."""
        if not n:
            return self
        if n < 0:
            raise ConfigError(f"num_prompts: expected >= 0, got {n}")
        return PromptSet(self.name, self.prompts[:n])


def prompt_set_kind(name: str) -> str:
    """How a report labels the built-in set `name`: USER_LIKE, IN_DISTRIBUTION, LONG_CONTEXT, or '' (a file)."""
    if name in USER_LIKE_PROMPT_SETS:
        return USER_LIKE
    if name in LONG_CONTEXT_PROMPT_SETS:
        return LONG_CONTEXT
    return IN_DISTRIBUTION if name in IN_DISTRIBUTION_PROMPT_SETS else ""


def _first_user_turn(messages: Sequence[tuple[str, str]], where: str) -> tuple[tuple[str, str], ...]:
    """System messages before the first user message, plus that message."""
    out: list[tuple[str, str]] = []
    for role, content in messages:
        if role == "user":
            out.append((role, content))
            return tuple(out)
        if role == "system":
            out.append((role, content))
    raise DataFormatError(f"{where}: no user message to use as the prompt")


def parse_prompt_row(row: Any, *, where: str, default_id: str) -> BenchPrompt:
    """One JSON row (any shape in the module docstring) -> BenchPrompt. Errors name `where`."""
    if isinstance(row, dict) and "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise DataFormatError(f"{where}: 'turns' must be a non-empty list of strings, got {turns!r:.80}")
        qid = row.get("question_id", default_id)
        return BenchPrompt(f"mt-bench:{qid}", (("user", turns[0]),), str(row.get("category", "")))
    from eaglewire.data.formats import parse_row

    rid, msgs = parse_row(row, where=where)
    pairs = [(m.role, m.content) for m in msgs]
    category = row.get("category") if isinstance(row, dict) else None
    return BenchPrompt(
        rid or default_id, _first_user_turn(pairs, where), category if isinstance(category, str) else ""
    )


def read_prompt_file(path: Path) -> PromptSet:
    """A JSONL prompt file -> PromptSet (ids default to `<file name>:<line>`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"prompt set {str(path)!r}: no such file, and not a built-in name",
            fix=f"pass a JSONL file or one of {', '.join(BUILTIN_PROMPT_SETS)}",
        )
    prompts: list[BenchPrompt] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{where}: invalid JSON ({e.msg})") from None
            prompts.append(parse_prompt_row(row, where=where, default_id=f"{path.name}:{lineno}"))
    if not prompts:
        raise DataFormatError(f"{path}: no prompts (the file is empty)")
    return PromptSet(str(path), tuple(prompts))


def _package_prompts(file_name: str) -> list[BenchPrompt]:
    source = resources.files("eaglewire.bench").joinpath("data").joinpath(file_name)
    prompts = []
    for lineno, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            prompts.append(
                parse_prompt_row(json.loads(line), where=f"{file_name}:{lineno}", default_id=str(lineno))
            )
    return prompts


def load_mt_bench() -> PromptSet:
    """The first turns of the 80 MT-bench questions shipped as package data."""
    prompts = _package_prompts(MT_BENCH_FILE)
    if len(prompts) != MT_BENCH_COUNT:
        raise DataFormatError(f"{MT_BENCH_FILE}: expected {MT_BENCH_COUNT} questions, got {len(prompts)}")
    return PromptSet("mt-bench", tuple(prompts))


def load_user_eval() -> PromptSet:
    """The instructions of bench/data/user_eval.jsonl (evaluation only: never trained or tuned on),
    interleaved by category (the first of each category, then the second of each, ...), so that a run
    on the first N prompts covers as many kinds of request as it can; the whole set is the same."""
    rows = _package_prompts(USER_EVAL_FILE)
    categories = list(dict.fromkeys(p.category for p in rows))  # in file order
    rank = {id(p): sum(q.category == p.category for q in rows[:i]) for i, p in enumerate(rows)}
    ordered = sorted(rows, key=lambda p: (rank[id(p)], categories.index(p.category)))
    return PromptSet("user-eval", tuple(ordered))


def load_long_prompts(name: str) -> PromptSet:
    """`long-1k` .. `long-8k`: multi-turn histories kept whole (each ends with the user turn answered)."""
    from eaglewire.bench.long_prompts import load_long_context

    prompts = load_long_context(name.removeprefix("long-"))
    return PromptSet(name, tuple(BenchPrompt(p.prompt_id, p.messages, p.kind) for p in prompts))


def load_builtin_prompts(name: str) -> PromptSet:
    """`chitchat-eval` / `humaneval-eval` (held-out splits of the data sets), `mt-bench`, `user-eval`
    or `long-1k` .. `long-8k`."""
    if name == "mt-bench":
        return load_mt_bench()
    if name == "user-eval":
        return load_user_eval()
    if name in LONG_CONTEXT_PROMPT_SETS:
        return load_long_prompts(name)
    if name not in _BUILTIN_DATA_SETS:
        raise ConfigError(f"unknown built-in prompt set {name!r}; known: {', '.join(BUILTIN_PROMPT_SETS)}")
    from eaglewire.data.builtin import load_builtin

    prompts = []
    for conv in load_builtin(_BUILTIN_DATA_SETS[name], split="eval"):
        pairs = [(m.role, m.content) for m in conv.messages]
        if not any(r == "user" for r, _ in pairs):
            continue
        prompts.append(BenchPrompt(conv.record_id, _first_user_turn(pairs, conv.record_id)))
    if not prompts:
        raise DataFormatError(f"built-in prompt set {name!r} has no prompts in its eval split")
    return PromptSet(name, tuple(prompts))


def load_prompt_set(name_or_file: str | Path, num_prompts: int | None = None) -> PromptSet:
    """A built-in name (BUILTIN_PROMPT_SETS) or a JSONL file; the first `num_prompts` (all if None)."""
    spec = str(name_or_file)
    found = load_builtin_prompts(spec) if spec in BUILTIN_PROMPT_SETS else read_prompt_file(Path(spec))
    return found.head(num_prompts)


def encode_prompt(tokenizer: Any, prompt: BenchPrompt, *, chat: bool = True) -> list[int]:
    """Token ids of the prompt: the chat template with a generation prompt (as `eaglewire generate`
    renders it: the template's text, tokenized without extra special tokens), or the raw user text."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "the target's tokenizer has no chat template",
                fix="pass --raw to benchmark on the raw prompt text",
            )
        text = tokenizer.apply_chat_template(prompt.chat(), tokenize=False, add_generation_prompt=True)
        return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    return [int(t) for t in tokenizer(prompt.text)["input_ids"]]
