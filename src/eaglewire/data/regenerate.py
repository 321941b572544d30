"""Regeneration (EAGLE-3's recipe): the target answers every user turn; the draft trains on its answers.

Multi-turn conversations are replayed: the original assistant turns are dropped and the target
answers user turn t seeing its own answers to turns 0..t-1. System messages stay in place.

Resumable and reproducible:
- the input is cut into fixed batches by position (`batch_size`); batch k, turn t is sampled
  with a seed derived from (seed, k, t), so a batch always yields the same answers;
- each finished conversation is appended to the output JSONL as one line, then flushed and
  fsync'ed; on rerun, ids already in the output are skipped. A batch that was only partly
  written is generated again in full (same composition, same seed) and only its missing
  records are written, so kill -9 + rerun gives exactly the records of an uninterrupted run,
  in the same order, none duplicated, none missing;
- a truncated last line (killed mid-write) is detected and cut before appending;
- the sampling settings are stored in `<output>.regen.json`; a rerun with other settings is
  refused (it would mix two distributions in one file).

`data/regenerate_http.py` regenerates through an OpenAI-compatible server instead, with the same
replay (`Replay`), resume checks (`open_resume`), rows and order.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from eaglewire.data.chat_masks import prompt_ids, resolve_chat_template
from eaglewire.data.formats import Conversation, Message
from eaglewire.data.generation import GenerateFn, SamplingConfig, generate_answers, pick_generate_fn
from eaglewire.errors import ConfigError, DataFormatError
from eaglewire.io_utils import atomic_write_json, sha256_text
from eaglewire.target.loading import LoadedTarget
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)

SEED_STRIDE_BATCH = 1_000_003
SEED_STRIDE_TURN = 1_009
SEED_MOD = 2**31 - 1


@dataclass
class RegenerateStats:
    conversations: int = 0
    already_done: int = 0
    written: int = 0
    answers: int = 0
    answers_cut_at_max_tokens: int = 0
    conversations_cut_at_context: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    stopped_at_time_budget: bool = False  # max_seconds ran out: a rerun with more time resumes
    backend: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_second": round(self.tokens_per_second, 1)}


def batch_seed(seed: int, batch_index: int, turn: int) -> int:
    return (seed * SEED_STRIDE_BATCH + batch_index * SEED_STRIDE_TURN + turn) % SEED_MOD


def sidecar_path(output: Path) -> Path:
    return output.with_name(output.name + ".regen.json")


def scan_output(output: Path) -> dict[str, int]:
    """Ids already in `output` (id -> line). Cuts a truncated last line; other bad lines are errors."""
    if not output.exists():
        return {}
    data = output.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        log.warning(
            "%s: last line is incomplete (%d bytes, interrupted write); removing it", output, len(data) - keep
        )
        with open(output, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        data = data[:keep]
    done: dict[str, int] = {}
    for lineno, raw in enumerate(data.split(b"\n")[:-1] if data else [], start=1):
        try:
            rid = json.loads(raw.decode("utf-8"))["id"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise DataFormatError(
                f"{output}:{lineno}: not a regenerated record ({type(e).__name__}); the file was edited or is not "
                "a regeneration output",
                fix="move the file away and regenerate, or delete that line",
            ) from None
        if rid in done:
            raise DataFormatError(f"{output}:{lineno}: duplicate id {rid!r} (first at line {done[rid]})")
        done[rid] = lineno
    return done


def _check_sidecar(output: Path, settings: dict[str, Any], resuming: bool) -> None:
    """Refuse to resume `output` under other settings (reads only; `write_sidecar` records them)."""
    path = sidecar_path(output)
    if resuming and path.exists():
        old = read_json_file(path)
        diffs = [f"{k}: before={old.get(k)!r} now={v!r}" for k, v in settings.items() if old.get(k) != v]
        if diffs:
            raise ConfigError(
                f"{output} was generated with other settings; resuming would mix them:\n  "
                + "\n  ".join(diffs),
                fix="rerun with the original settings, or write to a new --out",
            )


def write_sidecar(output: Path, settings: dict[str, Any]) -> None:
    atomic_write_json(sidecar_path(output), settings)


def open_resume(conversations: list[Conversation], output: Path, settings: dict[str, Any]) -> dict[str, int]:
    """The resume state of `output` for `conversations` (ids already written -> line) after the
    checks every regeneration makes: unique input ids, no foreign record in `output`, the settings
    of the run that wrote it. Adds `input_ids_sha256` to `settings`. Writes nothing but the cut of a
    truncated last line: the caller records `settings` (`write_sidecar`) before it appends a row."""
    ids = [c.record_id for c in conversations]
    if len(set(ids)) != len(ids):
        raise DataFormatError("input conversations have duplicate ids; resume is keyed by id")
    done = scan_output(output)
    unknown = sorted(set(done) - set(ids))
    if unknown:
        raise DataFormatError(
            f"{output}: holds {len(unknown)} records whose ids are not in the input (e.g. {unknown[0]!r})",
            fix="pass the same input as the run that wrote it, or write to a new --out",
        )
    settings["input_ids_sha256"] = sha256_text("\n".join(ids))
    _check_sidecar(output, settings, resuming=bool(done))
    return done


class Replay:
    """One conversation replayed turn by turn. Local batches and server requests both use it, so
    both send the same prompts: system messages stay in place, the original answers are dropped, and
    the target answers user turn t seeing its own answers to turns 0..t-1. A turn whose prompt is
    longer than `max_prompt_tokens` ends the conversation before it (counted in `stats`)."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.history: list[Message] = []
        self.finish: list[str] = []
        self.pending: list[Message] = list(conversation.messages)  # messages not yet replayed
        self.stopped = False

    def next_turn(
        self, tokenizer: Any, template: str, max_prompt_tokens: int | None, stats: RegenerateStats
    ) -> tuple[list[dict[str, str]], list[int]] | None:
        """The next prompt: (chat messages, their ids with the generation prompt), or None when done."""
        if self.stopped:
            return None
        rest = self.pending
        # move system messages and the next user message into the history; drop old answers
        while rest and rest[0].role != "user":
            m = rest.pop(0)
            if m.role == "system":
                self.history.append(m)
        if not rest:
            return None
        self.history.append(rest.pop(0))
        chat = [{"role": m.role, "content": m.content} for m in self.history]
        ids = prompt_ids(tokenizer, chat, template)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            self.history.pop()
            self.stopped = True
            stats.conversations_cut_at_context += 1
            return None
        return chat, ids

    def answer(self, text: str, finish: str) -> None:
        self.history.append(Message("assistant", text))
        self.finish.append(finish)

    def row(self) -> dict[str, Any]:
        """The output row `{"id", "messages", "finish"}`."""
        return {
            "id": self.conversation.record_id,
            "messages": [{"role": m.role, "content": m.content} for m in self.history],
            "finish": self.finish,
        }


def _answer_batch(
    target: LoadedTarget,
    convs: list[Conversation],
    template: str,
    sampling: SamplingConfig,
    batch_index: int,
    max_prompt_tokens: int | None,
    generate_fn: GenerateFn,
    stats: RegenerateStats,
) -> list[dict[str, Any]]:
    """Replay every conversation of one batch turn by turn; returns output rows in batch order."""
    tok = target.tokenizer
    replays = [Replay(c) for c in convs]
    turn = 0
    while True:
        active, prompts = [], []
        for r in replays:
            nxt = r.next_turn(tok, template, max_prompt_tokens, stats)
            if nxt is not None:
                active.append(r)
                prompts.append(nxt[1])
        if not active:
            break
        results = generate_answers(
            target, prompts, sampling, batch_seed(sampling.seed, batch_index, turn), generate_fn=generate_fn
        )
        for r, (ids, finish) in zip(active, results, strict=True):
            r.answer(tok.decode(ids, skip_special_tokens=True), finish)
            stats.generated_tokens += len(ids)
            stats.answers += 1
            stats.answers_cut_at_max_tokens += finish == "length"
        turn += 1
    return [r.row() for r in replays]


def regenerate(
    target: LoadedTarget,
    conversations: list[Conversation],
    output: Path,
    sampling: SamplingConfig,
    *,
    chat_template: str | None = None,
    max_prompt_tokens: int | None = None,
    show_progress: bool = True,
    generate_fn: GenerateFn | None = None,
    max_seconds: float = 0.0,
    allow_empty: bool = False,
) -> RegenerateStats:
    """Answer every user turn of `conversations` with `target`; append rows to `output` (JSONL).

    max_seconds > 0 starts no new batch once that much time has passed (one batch always runs):
    the rows written so far are complete conversations, and a later call with the same input resumes after them.
    No conversations is an error (an empty or wholly skipped input) unless `allow_empty`: then the
    output is an empty file.

    Output rows: `{"id", "messages": [...], "finish": ["stop"|"length", ...]}` (OpenAI format, read
    back by `formats.read_conversations`).
    """
    output = Path(output)
    if not conversations and not allow_empty:
        raise DataFormatError(
            "no conversations to regenerate: the input is empty, or every row of it was skipped",
            fix="check --input (and --limit / --split); pass --allow-empty to write an empty output anyway",
        )
    if target.tokenizer is None:
        raise ConfigError(f"target {target.path} has no tokenizer; regeneration needs one")
    template = resolve_chat_template(target.tokenizer, chat_template)
    fn = generate_fn or pick_generate_fn()
    reserve = getattr(fn, "reserve", None)
    if reserve is not None and max_prompt_tokens is not None:
        # size the runner once for the longest prompt any turn may send (a rebuild recompiles)
        reserve(sampling.batch_size, max_prompt_tokens + sampling.max_new_tokens)
    settings = {
        **asdict(sampling),
        "target": str(target.path),
        "chat_template_hash": sha256_text(template),
        "max_prompt_tokens": max_prompt_tokens,
    }
    done = open_resume(conversations, output, settings)
    write_sidecar(output, settings)
    stats = RegenerateStats(conversations=len(conversations), already_done=len(done), backend=fn.__module__)
    output.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(
        total=len(conversations), initial=len(done), desc="regenerate", unit="conv", disable=not show_progress
    )
    start = time.perf_counter()
    B = sampling.batch_size
    with open(output, "a", encoding="utf-8") as f:
        for k in range(0, len(conversations), B):
            batch = conversations[k : k + B]
            if all(c.record_id in done for c in batch):
                continue
            if max_seconds and stats.answers and time.perf_counter() - start >= max_seconds:
                stats.stopped_at_time_budget = True
                log.warning(
                    "regeneration stopped at its %.0f s budget after %d of %d conversations; "
                    "rerun to continue",
                    max_seconds,
                    len(done),
                    len(conversations),
                )
                break
            rows = _answer_batch(target, batch, template, sampling, k // B, max_prompt_tokens, fn, stats)
            for row in rows:
                if row["id"] in done:
                    continue
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
                done[row["id"]] = -1
                stats.written += 1
                bar.update(1)
            stats.seconds = time.perf_counter() - start
            bar.set_postfix_str(f"{stats.tokens_per_second:.1f} tok/s")
    bar.close()
    stats.seconds = time.perf_counter() - start
    log.info(
        "regenerated %d conversations (%d already done) into %s: %d answers, %d tokens, %.1f tok/s; "
        "%d answers cut at max_new_tokens=%d",
        stats.written,
        stats.already_done,
        output,
        stats.answers,
        stats.generated_tokens,
        stats.tokens_per_second,
        stats.answers_cut_at_max_tokens,
        sampling.max_new_tokens,
    )
    return stats
