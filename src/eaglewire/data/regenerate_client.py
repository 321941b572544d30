"""The HTTP side of `data regenerate --server URL`: one aiohttp session against an OpenAI-compatible server,
its chat requests and answers, and the retry policy for transient failures (`data.regenerate_http` says
which failures those are and how the run resumes after the last one)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from eaglewire.data.generation import SamplingConfig
from eaglewire.errors import ConfigError, ServerError

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
