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
import email.utils
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from tqdm import tqdm

from eaglewire.data.chat_masks import resolve_chat_template
from eaglewire.data.formats import Conversation
from eaglewire.data.generation import SamplingConfig
from eaglewire.data.regenerate import RegenerateStats, Replay, batch_seed, open_resume, write_sidecar
from eaglewire.errors import ConfigError, DataFormatError, ServerError
from eaglewire.io_utils import sha256_text

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})  # busy, or a proxy in front of a restarting server
FINISH_REASONS = frozenset({"stop", "length"})
EXCERPT = 300  # characters of a server's answer quoted in an error


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient failures; a `Retry-After` is the least wait."""

    max_retries: int = 8  # retries per request after the first attempt
    base_seconds: float = 0.5  # the first backoff; doubles per retry
    max_seconds: float = 30.0  # backoff cap (a longer Retry-After is still honoured)

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry `attempt` (0-based): min(cap, base * 2^attempt) scaled by
        U(0.5, 1), and never less than a server's Retry-After (plus up to 10%, spreading the clients it
        told the same time): a server that keeps saying "1 s" is still backed off from."""
        backoff = min(self.max_seconds, self.base_seconds * 2.0**attempt) * (0.5 + 0.5 * rng.random())
        if retry_after is None:
            return backoff
        return max(backoff, retry_after * (1.0 + 0.1 * rng.random()))


@dataclass(frozen=True)
class ServerSettings:
    """Where and how to send the requests (`data regenerate --server ...`)."""

    url: str  # as given; `server_base_url` makes it the API base
    model: str | None = None  # None: the one model the server lists
    concurrency: int = 8  # requests in flight at most
    api_key: str | None = None  # sent as `Authorization: Bearer ...`
    request_timeout_s: float = 600.0  # one request, queueing on the server included
    retry: RetryPolicy = RetryPolicy()


@dataclass(frozen=True)
class ChatAnswer:
    text: str
    finish: str
    prompt_tokens: int | None
    completion_tokens: int | None


class _Retry(Exception):
    """Internal: a transient failure found in a 200 answer (an aborted generation)."""


def server_base_url(url: str) -> str:
    """The API base (`http://host:port/v1`) from what the user gave: the server's address, the
    base itself, or the chat completions URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"--server {url}: expected an http(s) URL of an OpenAI-compatible server, such as "
            "http://127.0.0.1:30000 or http://host:8000/v1",
            fix="pass --server http://HOST:PORT",
        )
    path = parts.path.rstrip("/")
    for tail in ("/chat/completions", "/completions", "/models"):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a `Retry-After` header: delta-seconds (a fraction is accepted) or an HTTP date;
    None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _excerpt(body: str) -> str:
    """An error body's message (OpenAI, vLLM and FastAPI shapes), else its first characters."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        for msg in (
            err.get("message") if isinstance(err, dict) else err,
            data.get("message"),
            data.get("detail"),
        ):
            if isinstance(msg, str) and msg:
                return msg[:EXCERPT]
    text = " ".join(body.split())
    return text[:EXCERPT] + ("..." if len(text) > EXCERPT else "") if text else "(empty body)"


def _http_fix(status: int) -> str:
    if status in (401, 403):
        return "pass the server's key with --api-key (or set EAGLEWIRE_SERVER_API_KEY)"
    if status == 404:
        return "pass the server's address to --server (http://HOST:PORT or its /v1 base) and a served model to --model"
    if status in (400, 413, 422):
        return (
            "if it names the context length, pass --max-prompt-tokens below the server's limit (or a lower "
            "--max-new-tokens); rerun resumes after the last written conversation"
        )
    return "read the server's log; rerun resumes after the last written conversation"


def parse_chat_answer(data: Any, where: str) -> ChatAnswer:
    """`choices[0].message.content`, `finish_reason` and `usage` of a chat completion (`where` names
    the URL, record and turn in an error). An aborted generation raises `_Retry`."""
    try:
        choice = data["choices"][0]
        content = choice["message"].get("content")
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ServerError(
            f"{where}: the answer is not a chat completion (no choices[0].message): "
            f"{_excerpt(json.dumps(data))}",
            fix="pass --server the address of an OpenAI-compatible server (vLLM, SGLang, eaglewire serve)",
        ) from None
    if finish == "abort":
        raise _Retry("the server aborted the generation (finish_reason 'abort')")
    if content is not None and not isinstance(content, str):
        raise ServerError(
            f"{where}: choices[0].message.content: expected a string, got {type(content).__name__}"
        )
    if finish not in FINISH_REASONS:
        raise ServerError(
            f"{where}: finish_reason: expected 'stop' or 'length', got {finish!r}; regeneration keeps only "
            "answers that ended at the end of turn or at max_tokens"
        )
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}

    def count(key: str) -> int | None:
        v = usage.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    return ChatAnswer(content or "", finish, count("prompt_tokens"), count("completion_tokens"))


def chat_request(
    model: str, messages: list[dict[str, str]], sampling: SamplingConfig, seed: int
) -> dict[str, Any]:
    """The request body of one turn: greedy when temperature is 0 (no top_p, no seed: nothing to
    sample), else temperature, top_p and the turn's seed."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "stream": False,
    }
    if sampling.temperature > 0:
        body["top_p"] = sampling.top_p
        body["seed"] = seed
    return body


class ServerClient:
    """One aiohttp session against one server, with the retry policy. Use as `async with`."""

    def __init__(self, settings: ServerSettings, *, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.base_url = server_base_url(settings.url)
        self.retries = 0  # transient failures retried so far
        self._rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ServerClient:
        aiohttp = _aiohttp()
        headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.settings.concurrency),
            timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout_s),
            headers=headers,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None, what: str, *, connect_retry: bool = True
    ) -> tuple[int, Any]:
        """(status, parsed JSON) of a 200 answer, or (404, None) for GET; transient failures are
        retried, anything else is a `ServerError` naming the URL and `what`."""
        return await self._with_retries(method, path, body, what, connect_retry=connect_retry, parse=None)

    async def chat(self, body: dict[str, Any], what: str) -> ChatAnswer:
        answer = await self._with_retries(
            "POST", "/chat/completions", body, what, connect_retry=True, parse=parse_chat_answer
        )
        assert isinstance(answer, ChatAnswer)
        return answer

    async def _with_retries(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        what: str,
        *,
        connect_retry: bool,
        parse: Any,
    ) -> Any:
        aiohttp = _aiohttp()
        assert self._session is not None, "use ServerClient as `async with`"
        url = self.base_url + path
        where = f"{method} {url} ({what})"
        policy = self.settings.retry
        for attempt in range(policy.max_retries + 1):
            retry_after: float | None = None
            try:
                async with self._session.request(method, url, json=body) as resp:
                    raw = (await resp.read()).decode("utf-8", errors="replace")
                    if resp.status == 200:
                        try:
                            data = json.loads(raw)
                        except ValueError:
                            raise ServerError(
                                f"{where}: HTTP 200 with a body that is not JSON: {_excerpt(raw)}",
                                fix="pass --server the address of an OpenAI-compatible server",
                            ) from None
                        return parse(data, where) if parse is not None else (200, data)
                    if resp.status == 404 and method == "GET" and parse is None:
                        return 404, None
                    if resp.status not in RETRY_STATUSES:
                        raise ServerError(
                            f"{where}: HTTP {resp.status}: {_excerpt(raw)}", fix=_http_fix(resp.status)
                        )
                    cause = f"HTTP {resp.status}"
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            except aiohttp.ClientConnectorError as e:
                if not connect_retry:
                    raise ServerError(
                        f"--server {self.settings.url}: nothing answers at {url} ({e.os_error or e})",
                        fix="start the server first, or pass its address to --server (http://HOST:PORT)",
                    ) from None
                cause = f"cannot connect ({e.os_error or e})"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as e:
                cause = f"{type(e).__name__}{f': {e}' if str(e) else ''}"
            except _Retry as e:
                cause = str(e)
            if attempt == policy.max_retries:
                raise ServerError(
                    f"{where}: gave up after {attempt + 1} attempts; the last failed with {cause}",
                    fix="check the server's health; raise --max-retries or lower --concurrency, then rerun "
                    "(it resumes after the last written conversation)",
                )
            delay = policy.delay(attempt, retry_after, self._rng)
            self.retries += 1
            (log.warning if self.retries == 1 else log.info)(
                "%s: %s; retry %d of %d in %.2f s%s",
                where,
                cause,
                attempt + 1,
                policy.max_retries,
                delay,
                " (Retry-After)" if retry_after is not None else "",
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def resolve_model(self) -> str:
        """The model to ask for: `settings.model` (checked against `GET /v1/models` when the server
        lists its models), else the one model the server lists. Fails fast when nothing answers."""
        status, data = await self.request(
            "GET", "/models", None, "list the served models", connect_retry=False
        )
        served: list[str] | None = None
        if status == 200:
            try:
                served = [str(m["id"]) for m in data["data"]]
            except (KeyError, TypeError):
                served = None
        requested = self.settings.model
        if requested is not None:
            if served is not None and requested not in served:
                raise ConfigError(
                    f"--model {requested}: the server at {self.base_url} serves {served}",
                    fix="pass one of those to --model",
                )
            return requested
        if served is None:
            raise ConfigError(
                f"--server {self.settings.url}: {self.base_url}/models lists no models; the request needs a name",
                fix="pass the served model's name with --model",
            )
        if len(served) != 1:
            raise ConfigError(
                f"--server {self.settings.url}: serves {len(served)} models {served}; which one answers?",
                fix="pass one of them with --model",
            )
        return served[0]


def _aiohttp() -> Any:
    try:
        import aiohttp
    except ImportError:
        raise ConfigError(
            "data regenerate --server needs the aiohttp package, which is not installed",
            fix="pip install aiohttp (the package's `serve` extra; requirements/cpu.txt pins the tested version)",
        ) from None
    return aiohttp


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
