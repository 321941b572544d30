"""`data regenerate --server`: regeneration through an OpenAI-compatible server, over real HTTP on 127.0.0.1.

The server here is a small aiohttp app of the test's own that answers with the tiny target's *real*
greedy continuation (transformers' `generate`, batch 1, the tokenizer's own chat template: an
implementation independent of local regeneration's batched engine). It can answer 503 with
Retry-After, 429, drop the connection, refuse with 400, or hold one conversation back so the others
finish first. What must hold: the output file is byte-identical to local greedy regeneration's
(records, ids, order), every transient failure is retried (Retry-After honoured), retries are
bounded and end in a named error, and kill -9 + rerun gives the same file.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from eaglewire.data.formats import Conversation, Message
from eaglewire.data.generation import SamplingConfig, generate_answers, hf_generate
from eaglewire.data.regenerate import regenerate, sidecar_path
from eaglewire.data.regenerate_client import (
    RetryPolicy,
    ServerSettings,
    _Retry,
    parse_chat_answer,
    parse_retry_after,
    server_base_url,
)
from eaglewire.data.regenerate_http import regenerate_via_server
from eaglewire.errors import ConfigError, ServerError
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target, save_tiny_target

web = pytest.importorskip("aiohttp.web")

EAGLEWIRE = str(Path(sys.executable).with_name("eaglewire"))
MODEL = "tiny-target"
MAX_NEW_TOKENS = 6
MAX_PROMPT_TOKENS = 100
GREEDY = SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, temperature=0.0, top_p=1.0, seed=0, batch_size=4)
FAST_RETRY = RetryPolicy(max_retries=4, base_seconds=0.02, max_seconds=0.1)


# --- the test's server -------------------------------------------------------------------------------


@dataclass
class Seen:
    at: float
    body: dict[str, Any]
    answer: str  # "200", "503", "429", "drop", "400"


@dataclass
class TargetServer:
    """An OpenAI-compatible server on 127.0.0.1 that answers with `target`'s greedy continuation.

    `faults`: what the next chat requests get instead of an answer, in order ("503" with Retry-After
    1, "429" without it, "drop": the connection closed mid-request, "400"). `fault_for(body)` may
    answer any request with one (None: a real answer). `delay(body)` seconds before answering."""

    target: LoadedTarget
    faults: list[str] = field(default_factory=list)
    fault_for: Callable[[dict[str, Any]], str | None] = lambda body: None
    delay: Callable[[dict[str, Any]], float] = lambda body: 0.0
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        tok = self.target.tokenizer
        text = tok.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert body["temperature"] == 0 and "seed" not in body  # greedy asks for nothing to sample
        cfg = SamplingConfig(max_new_tokens=body["max_tokens"], temperature=0.0, top_p=1.0, batch_size=1)
        [(new, finish)] = generate_answers(self.target, [ids], cfg, seed=0, generate_fn=hf_generate)
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": tok.decode(new, skip_special_tokens=True)},
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(new),
                "total_tokens": len(ids) + len(new),
            },
        }

    async def chat(self, request: Any) -> Any:
        body = await request.json()
        fault = self.faults.pop(0) if self.faults else self.fault_for(body)
        self.seen.append(Seen(time.monotonic(), body, fault or "200"))
        if fault == "503":
            return web.json_response({"error": {"message": "busy"}}, status=503, headers={"Retry-After": "1"})
        if fault == "429":
            return web.json_response({"error": {"message": "rate limited"}}, status=429)
        if fault == "400":
            msg = "This model's maximum context length is 8 tokens"
            return web.json_response({"object": "error", "message": msg}, status=400)
        if fault == "drop":
            request.transport.abort()
            return web.Response()
        await asyncio.sleep(self.delay(body))
        return web.json_response(self.answer(body))

    async def models(self, request: Any) -> Any:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def __enter__(self) -> TargetServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", 0).start())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert started.wait(10)
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def chats(self, answer: str = "200") -> list[Seen]:
        return [s for s in self.seen if s.answer == answer]


# --- fixtures ----------------------------------------------------------------------------------------


def _conversations() -> list[Conversation]:
    """Multi-turn with a system message, prompt-only rows, and one that outgrows MAX_PROMPT_TOKENS."""
    long = "The quick brown fox jumps over the lazy dog. " * 4
    return [
        Conversation(
            "slow-first",
            (
                Message("system", "be brief"),
                Message("user", "Hello! How are you?"),
                Message("assistant", "ORIGINAL ONE"),
                Message("user", "What is your favourite book?"),
                Message("assistant", "ORIGINAL TWO"),
            ),
        ),
        Conversation("code", (Message("user", "def add(a, b):"),)),
        Conversation("numbers", (Message("user", "1, 2, 3, 4, 5"), Message("user", "and more numbers"))),
        Conversation(
            "too-long", (Message("user", "Hello!"), Message("assistant", "x"), Message("user", long))
        ),
        Conversation("science", (Message("user", "I like reading about history and science."),)),
        Conversation("torch", (Message("user", "import torch"),)),
    ]


@pytest.fixture(scope="module")
def target() -> LoadedTarget:
    return make_tiny_target("llama", num_layers=2)


@pytest.fixture(scope="module")
def local_reference(target: LoadedTarget, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Local greedy regeneration of `_conversations()` (the engine's batched generation)."""
    out = tmp_path_factory.mktemp("local") / "local.jsonl"
    stats = regenerate(
        target, _conversations(), out, GREEDY, max_prompt_tokens=MAX_PROMPT_TOKENS, show_progress=False
    )
    assert stats.answers == 8 and stats.conversations_cut_at_context == 1
    return out


def _via_server(target: LoadedTarget, server: TargetServer, out: Path, **settings: Any) -> Any:
    opts = {"concurrency": 3, "retry": FAST_RETRY, **settings}
    return regenerate_via_server(
        target.tokenizer,
        _conversations(),
        out,
        GREEDY,
        ServerSettings(url=server.url, **opts),
        max_prompt_tokens=MAX_PROMPT_TOKENS,
        show_progress=False,
        rng=random.Random(0),
    )


# --- the tests ---------------------------------------------------------------------------------------


def test_served_greedy_output_equals_local_greedy_regeneration(
    target: LoadedTarget, local_reference: Path, tmp_path: Path
) -> None:
    """The first conversation is held back on every turn, so the others finish first: the file is
    still written in input order, byte for byte what local regeneration wrote."""
    out = tmp_path / "served.jsonl"
    slow = lambda body: 0.3 if body["messages"][0]["content"] == "be brief" else 0.0  # noqa: E731
    with TargetServer(target, delay=slow) as server:
        stats = _via_server(target, server, out)
    assert out.read_bytes() == local_reference.read_bytes()
    assert (stats.written, stats.answers, stats.conversations_cut_at_context) == (6, 8, 1)
    assert not stats.notes  # no retries; the server counted every prompt as the target's template does
    # the others finished before the first conversation's second turn was even answered
    first_done = max(s.at for s in server.chats() if s.body["messages"][0]["content"] == "be brief")
    assert sum(s.at < first_done for s in server.chats()) >= 4
    assert {s.body["max_tokens"] for s in server.chats()} == {MAX_NEW_TOKENS}
    settings = json.loads(sidecar_path(out).read_text())
    assert settings["model"] == MODEL and settings["temperature"] == 0.0
    # a rerun has nothing to do; a rerun with another sampling setting is refused
    with TargetServer(target) as server:
        assert _via_server(target, server, out).written == 0
        with pytest.raises(ConfigError, match="max_new_tokens: before=6 now=3"):
            regenerate_via_server(
                target.tokenizer,
                _conversations(),
                out,
                SamplingConfig(max_new_tokens=3, temperature=0.0),
                ServerSettings(url=server.url),
                max_prompt_tokens=MAX_PROMPT_TOKENS,
                show_progress=False,
            )
        assert not server.seen


def test_503_with_retry_after_429_and_a_dropped_connection_are_retried(
    target: LoadedTarget, local_reference: Path, tmp_path: Path
) -> None:
    out = tmp_path / "served.jsonl"
    with TargetServer(target, faults=["503", "drop", "429"]) as server:
        stats = _via_server(target, server, out, concurrency=1)
    assert out.read_bytes() == local_reference.read_bytes()
    assert [s.answer for s in server.seen[:4]] == ["503", "drop", "429", "200"]
    assert all(s.body == server.seen[0].body for s in server.seen[:4])  # the same request, again
    assert server.seen[1].at - server.seen[0].at >= 1.0  # Retry-After: 1 honoured
    assert stats.notes == ["3 requests retried (HTTP 429/502/503/504, dropped connections, timeouts)"]


def test_retries_are_bounded_then_a_named_error_and_a_rerun_resumes(
    target: LoadedTarget, local_reference: Path, tmp_path: Path
) -> None:
    """A server that keeps answering 503 for one conversation: the run stops naming the record, the
    URL, the attempts and the fix; what came before it stays written, and a rerun completes the
    same file."""
    out = tmp_path / "served.jsonl"
    busy = lambda body: "429" if body["messages"][0]["content"] == "1, 2, 3, 4, 5" else None  # noqa: E731
    with TargetServer(target, fault_for=busy) as server, pytest.raises(ServerError) as e:
        _via_server(target, server, out, concurrency=1, retry=RetryPolicy(2, 0.01, 0.02))
    msg = str(e.value)
    assert f"POST {server.url}/v1/chat/completions (record 'numbers', turn 0)" in msg
    assert "gave up after 3 attempts; the last failed with HTTP 429" in msg
    assert "--max-retries" in msg and "resumes" in msg
    assert len(server.chats("429")) == 3
    written = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert written == ["slow-first", "code"]  # input order, up to the conversation that failed
    with TargetServer(target) as server:
        stats = _via_server(target, server, out)
    assert stats.already_done == 2 and stats.written == 4
    assert out.read_bytes() == local_reference.read_bytes()


def test_a_refused_request_is_named_and_leaves_nothing(target: LoadedTarget, tmp_path: Path) -> None:
    out = tmp_path / "served.jsonl"
    with TargetServer(target, fault_for=lambda body: "400") as server:
        with pytest.raises(ServerError) as e:
            _via_server(target, server, out)
        assert "HTTP 400: This model's maximum context length is 8 tokens" in str(e.value)
        assert "--max-prompt-tokens" in str(e.value)
        bodies = [json.dumps(s.body) for s in server.seen]
        assert 1 <= len(bodies) <= 3 and len(set(bodies)) == len(bodies)  # a 400 is not retried
        with pytest.raises(ConfigError, match=r"--model other: the server at .* serves \['tiny-target'\]"):
            _via_server(target, server, out, model="other")
    assert not out.exists() and not sidecar_path(out).exists()  # no conversation finished: nothing written
    with pytest.raises(ServerError, match="nothing answers at"):
        _via_server(target, server, out)  # the server is gone


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _start_serve(target_dir: Path, draft_dir: Path, cwd: Path) -> subprocess.Popen[str]:
    argv = [EAGLEWIRE, "serve", "--target", str(target_dir), "--draft", str(draft_dir), "--port", "0",
            "--dtype", "float32", "--device", "cpu"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )


def test_through_eaglewire_serve_equals_local_and_kill9_then_rerun_gives_the_same_file(
    tmp_path: Path,
) -> None:
    """Issue 45 test (c): `eaglewire serve` (a subprocess, speculative with a draft) answers; the
    console script, killed with SIGKILL mid-run, then rerun, writes byte for byte what local greedy
    regeneration writes. The server is frozen (SIGSTOP) the moment the first record lands, so the kill
    always falls mid-run, with requests in flight."""
    from typer.testing import CliRunner

    from eaglewire.cli import app
    from eaglewire.data.formats import read_conversations
    from eaglewire.draft.init import init_draft
    from eaglewire.draft.io import save_draft
    from eaglewire.target.identity import build_contract

    target = make_tiny_target("llama", num_layers=4)
    target_dir = save_tiny_target(target, tmp_path / "target")
    contract = build_contract(target, (1, 2, 3))
    draft_dir = save_draft(init_draft(target, contract).eval(), contract, tmp_path / "draft")
    words = "hello how are you the quick brown fox jumps over lazy dog numbers book".split()  # noqa: SIM905
    n = 12
    src = tmp_path / "in.jsonl"
    rows = [{"id": f"r{i}", "prompt": " ".join(words[i % 9 : i % 9 + 4])} for i in range(n)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    serve = _start_serve(target_dir, draft_dir, tmp_path)
    try:
        # while the server starts: local greedy regeneration, the reference
        convs, _ = read_conversations(src)
        reference = tmp_path / "local.jsonl"
        regenerate(
            target, convs, reference, SamplingConfig(max_new_tokens=16, temperature=0.0), show_progress=False
        )
        assert serve.stdout is not None
        line = serve.stdout.readline()
        assert "listening on http://" in line, line
        url = line.split("listening on ")[1].strip()
        out = tmp_path / "out.jsonl"
        cmd = [EAGLEWIRE, "data", "regenerate", "--target", str(target_dir), "--input", str(src), "--out", str(out),
               "--server", url, "--concurrency", "2", "--max-new-tokens", "16", "--no-progress"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        deadline = time.time() + 60
        while _lines(out) < 1 and child.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        os.kill(serve.pid, signal.SIGSTOP)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        os.kill(serve.pid, signal.SIGCONT)
        assert child.returncode == -signal.SIGKILL, child.stderr.read().decode() if child.stderr else ""
        written = _lines(out)
        assert 1 <= written < n, f"the child finished or never started ({written} lines)"
        # the rerun in this process (the same command; the test spares a second start-up)
        rerun = CliRunner().invoke(app, cmd[1:], env={"COLUMNS": "200"})
        assert rerun.exit_code == 0, rerun.output
        assert f"server {url}/v1 ({target_dir})" in rerun.output
        assert re.search(rf"already done \(resumed\) +{written} ", rerun.output), rerun.output
    finally:
        serve.kill()
        serve.wait(30)
    assert out.read_bytes() == reference.read_bytes()  # same records, same order, none duplicated or missing
    assert json.loads(sidecar_path(out).read_text())["model"] == str(target_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(  # the server wrote nothing
        [
            "target",
            "draft",
            "in.jsonl",
            "local.jsonl",
            "local.jsonl.regen.json",
            "out.jsonl",
            "out.jsonl.regen.json",
        ]
    )


# --- the pure parts ----------------------------------------------------------------------------------


def test_server_url_forms() -> None:
    assert server_base_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000/v1"
    assert server_base_url("http://h:8000/v1/") == "http://h:8000/v1"
    assert server_base_url("https://h/api/v1/chat/completions") == "https://h/api/v1"
    for bad in ("localhost:8000", "ftp://h", "http://"):
        with pytest.raises(ConfigError, match="--server"):
            server_base_url(bad)


def test_retry_after_and_backoff() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("2") == 2.0 and parse_retry_after("0.25") == 0.25
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:05 GMT", now) == 5.0
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0  # in the past: now
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    policy, rng = RetryPolicy(max_retries=8, base_seconds=0.5, max_seconds=4.0), random.Random(0)
    for attempt, (lo, hi) in enumerate([(0.25, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 4.0), (2.0, 4.0)]):
        assert all(lo <= policy.delay(attempt, None, rng) <= hi for _ in range(50))
    assert all(3.0 <= policy.delay(0, 3.0, rng) <= 3.3 for _ in range(50))  # Retry-After: the least wait
    assert all(2.0 <= policy.delay(5, 1.0, rng) <= 4.0 for _ in range(50))  # still backed off from


def test_chat_answer_shapes() -> None:
    ok = {
        "choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3},
    }
    answer = parse_chat_answer(ok, "here")
    assert (answer.text, answer.finish, answer.prompt_tokens, answer.completion_tokens) == (
        "hi",
        "length",
        3,
        None,
    )
    null = {"choices": [{"message": {"content": None}, "finish_reason": "stop"}]}
    assert parse_chat_answer(null, "here").text == ""
    with pytest.raises(ServerError, match="here: the answer is not a chat completion"):
        parse_chat_answer({"object": "list"}, "here")
    with pytest.raises(ServerError, match="finish_reason: expected 'stop' or 'length', got 'tool_calls'"):
        parse_chat_answer({"choices": [{"message": {"content": ""}, "finish_reason": "tool_calls"}]}, "here")
    with pytest.raises(_Retry):
        parse_chat_answer({"choices": [{"message": {"content": ""}, "finish_reason": "abort"}]}, "here")


def test_server_flags_are_checked_before_any_work(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from eaglewire.cli import app

    base = [
        "data",
        "regenerate",
        "--target",
        str(tmp_path / "absent"),
        "--input",
        str(tmp_path / "absent.jsonl"),
    ]
    base += ["--out", str(tmp_path / "out.jsonl"), "--server", "http://127.0.0.1:9"]
    for flags, says in [
        (["--concurrency", "0"], "--concurrency: expected >= 1"),
        (["--max-retries", "-1"], "--max-retries: expected >= 0"),
        (["--request-timeout", "0"], "--request-timeout: expected >= 0.001"),
    ]:
        result = CliRunner().invoke(app, base + flags)
        assert isinstance(result.exception, ConfigError) and says in str(result.exception), result.output
    assert not list(tmp_path.iterdir())
