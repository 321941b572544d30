"""Regeneration through an OpenAI-compatible server (`data regenerate --server URL`): vLLM, SGLang,
`eaglewire serve`, or anything else that answers `POST /v1/chat/completions`. The path for targets
that need tensor parallelism or a cluster.

It mirrors local regeneration (`data/regenerate.py`) request for request:
- the same replay (`Replay`): each user turn is sent with the conversation so far, the target's own
  earlier answers in place of the original ones, system messages kept; a turn whose prompt (counted
  with `--target`'s tokenizer and chat template) is longer than `max_prompt_tokens` ends the
  conversation; `max_tokens` = `max_new_tokens`; the server stops at the target's end of turn
  (vLLM and SGLang read the same eos ids from the model's generation config as local regeneration);
  `finish` is the server's `finish_reason` ("stop" or "length");
- greedy when `temperature` is 0 (the server's greedy: token-exact where the engine is deterministic);
  sampled requests carry a seed derived from (seed, conversation index, turn);
- the same output rows, ids and order, and the same `.regen.json` resume rules (the served model's
  name stands where local regeneration records its target path). The answer is the server's
  detokenized text (special tokens skipped, as local regeneration decodes), so compare texts.

Requests run concurrently (at most `concurrency` in flight, one per conversation, since a turn needs
the answer before it), and finished conversations are appended in input order: a conversation that
completes early waits (at most a window of 4 x concurrency) for the ones before it. So the output
is always a prefix of the uninterrupted run's, and kill -9 + rerun gives the same file. 429, 502, 503,
504, an aborted generation, a dropped connection or a timeout is retried with exponential backoff and
jitter (never sooner than a `Retry-After` header says), at most `max_retries` times per request; then the run
stops with a `ServerError` (everything written so far stays; a rerun resumes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from eaglewire.data.chat_masks import resolve_chat_template
from eaglewire.data.formats import Conversation
from eaglewire.data.generation import SamplingConfig
from eaglewire.data.regenerate import RegenerateStats, Replay, batch_seed, open_resume, write_sidecar
from eaglewire.data.regenerate_client import ServerClient, ServerSettings, chat_request
from eaglewire.errors import ConfigError, DataFormatError
from eaglewire.io_utils import sha256_text

log = logging.getLogger(__name__)


class _InOrderWriter:
    """Appends rows to `output` in the order they were started, whatever order they finish in;
    flushes and fsyncs each. The settings sidecar and the file are written before the first row
    only, so a run that fails before any conversation is complete leaves nothing behind."""

    def __init__(self, output: Path, settings: dict[str, Any]) -> None:
        self.output, self.settings = output, settings
        self.next = 0
        self.ready: dict[int, dict[str, Any]] = {}
        self._file: IO[str] | None = None

    def open(self) -> None:
        if self._file is None:
            write_sidecar(self.output, self.settings)
            self.output.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.output, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def put(self, position: int, row: dict[str, Any]) -> int:
        """Keep `row` (started `position`-th); write every row now next in order. Returns how many."""
        self.ready[position] = row
        written = 0
        while self.next in self.ready:
            self.open()
            assert self._file is not None
            self._file.write(json.dumps(self.ready.pop(self.next), ensure_ascii=False) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            self.next += 1
            written += 1
        return written

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def regenerate_via_server(
    tokenizer: Any,
    conversations: list[Conversation],
    output: Path,
    sampling: SamplingConfig,
    server: ServerSettings,
    *,
    chat_template: str | None = None,
    max_prompt_tokens: int | None = None,
    show_progress: bool = True,
    max_seconds: float = 0.0,
    allow_empty: bool = False,
    rng: random.Random | None = None,
) -> RegenerateStats:
    """`regenerate` through a server: the same rows, ids, order and resume rules (module docstring).

    tokenizer: the target's (with its chat template, or `chat_template`): it counts each prompt for
    `max_prompt_tokens` and against the server's `usage.prompt_tokens` (a difference means the server
    renders conversations with another template: a note in the stats). `sampling.batch_size` is not
    used (`server.concurrency` is). max_seconds > 0 starts no new conversation once that much time has
    passed (one always runs); the ones started finish and are written.
    """
    output = Path(output)
    if not conversations and not allow_empty:
        raise DataFormatError(
            "no conversations to regenerate: the input is empty, or every row of it was skipped",
            fix="check --input (and --limit / --split); pass --allow-empty to write an empty output anyway",
        )
    if tokenizer is None:
        raise ConfigError("the target has no tokenizer; regeneration counts prompt tokens with it")
    template = resolve_chat_template(tokenizer, chat_template)
    return asyncio.run(
        _regenerate(
            tokenizer,
            conversations,
            output,
            sampling,
            server,
            template=template,
            max_prompt_tokens=max_prompt_tokens,
            show_progress=show_progress,
            max_seconds=max_seconds,
            rng=rng,
        )
    )


async def _regenerate(
    tokenizer: Any,
    conversations: list[Conversation],
    output: Path,
    sampling: SamplingConfig,
    server: ServerSettings,
    *,
    template: str,
    max_prompt_tokens: int | None,
    show_progress: bool,
    max_seconds: float,
    rng: random.Random | None,
) -> RegenerateStats:
    async with ServerClient(server, rng=rng) as client:
        model = await client.resolve_model()
        settings: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "model": model,
            "chat_template_hash": sha256_text(template),
            "max_prompt_tokens": max_prompt_tokens,
        }
        done = open_resume(conversations, output, settings)
        todo = [(i, c) for i, c in enumerate(conversations) if c.record_id not in done]
        stats = RegenerateStats(
            conversations=len(conversations),
            already_done=len(done),
            backend=f"server {client.base_url} ({model})",
        )
        writer = _InOrderWriter(output, settings)
        if not conversations:
            writer.open()  # --allow-empty: an empty output, as local regeneration writes
        log.info("regenerating %d conversations through %s (model %s)", len(todo), client.base_url, model)
        bar = tqdm(
            total=len(conversations),
            initial=len(done),
            desc="regenerate",
            unit="conv",
            disable=not show_progress,
        )
        mismatch: list[str] = []
        window = asyncio.Semaphore(max(4 * server.concurrency, 16))  # started but not yet written
        cursor = 0
        start = time.perf_counter()

        async def replay(index: int, conv: Conversation) -> dict[str, Any]:
            r = Replay(conv)
            turn = 0
            while (nxt := r.next_turn(tokenizer, template, max_prompt_tokens, stats)) is not None:
                chat, ids = nxt
                body = chat_request(model, chat, sampling, batch_seed(sampling.seed, index, turn))
                ans = await client.chat(body, f"record {conv.record_id!r}, turn {turn}")
                if ans.prompt_tokens is not None and ans.prompt_tokens != len(ids):
                    mismatch.append(
                        f"record {conv.record_id!r} turn {turn}: {len(ids)} here, {ans.prompt_tokens} served"
                    )
                r.answer(ans.text, ans.finish)
                n = ans.completion_tokens
                if n is None:
                    n = len(tokenizer(ans.text, add_special_tokens=False)["input_ids"])
                stats.generated_tokens += n
                stats.answers += 1
                stats.answers_cut_at_max_tokens += ans.finish == "length"
                stats.seconds = time.perf_counter() - start
                bar.set_postfix_str(f"{stats.tokens_per_second:.1f} tok/s", refresh=False)
                turn += 1
            return r.row()

        async def worker() -> None:
            nonlocal cursor
            while True:
                await window.acquire()
                if cursor >= len(todo) or stats.stopped_at_time_budget:
                    window.release()
                    return
                if max_seconds and cursor > 0 and time.perf_counter() - start >= max_seconds:
                    stats.stopped_at_time_budget = True
                    window.release()
                    return
                position, cursor = cursor, cursor + 1
                row = await replay(*todo[position])
                written = writer.put(position, row)
                stats.written += written
                bar.update(written)
                for _ in range(written):
                    window.release()

        tasks = [asyncio.create_task(worker()) for _ in range(min(server.concurrency, max(len(todo), 1)))]
        try:
            finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in finished:
                exc = t.exception()
                if exc is not None:
                    raise exc
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.close()
            bar.close()
    stats.seconds = time.perf_counter() - start
    if stats.stopped_at_time_budget:
        log.warning(
            "regeneration stopped at its %.0f s budget after %d of %d conversations; rerun to continue",
            max_seconds,
            stats.already_done + stats.written,
            len(conversations),
        )
    if client.retries:
        stats.notes.append(
            f"{client.retries} requests retried (HTTP 429/502/503/504, dropped connections, timeouts)"
        )
    if mismatch:
        stats.notes.append(
            f"{len(mismatch)} prompts counted differently by the server than by the target's chat template "
            f"(e.g. {mismatch[0]}): the server renders conversations with another template"
        )
        log.warning("%s", stats.notes[-1])
    log.info(
        "regenerated %d conversations (%d already done) into %s through %s: %d answers, %d tokens, %.1f tok/s; "
        "%d answers cut at max_new_tokens=%d",
        stats.written,
        stats.already_done,
        output,
        stats.backend,
        stats.answers,
        stats.generated_tokens,
        stats.tokens_per_second,
        stats.answers_cut_at_max_tokens,
        sampling.max_new_tokens,
    )
    return stats
