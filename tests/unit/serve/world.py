"""What the serve tests run on: a saved tiny Llama target and a briefly trained draft saved beside it,
and a real server on 127.0.0.1 run on an event loop in a background thread.

The draft is trained for about a second on the target's own greedy text (next-token loss at step 0
and one fed-back step), so that its drafts are often accepted: the statistics a response carries
are then not all zeros. Nothing is mocked: the server is the package's own aiohttp app on a real
socket, decoding with the real engine.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch
import torch.nn.functional as F

from eaglewire.contract.contract import Contract
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget, load_target
from tests.helpers.tiny import CORPUS, make_tiny_target, save_tiny_target

NUM_LAYERS = 8
AUX_BOUNDARIES = (2, 4, 5)  # the defaults [2, L//2, L-3]: every SGLang release reads their ids alike
SPEC = SpecArgs(num_steps=3, topk=2, num_draft_tokens=5)  # a small tree
TRAIN_STEPS = 30
GREEDY_TOKENS = 48


@dataclass
class World:
    target_dir: Path
    draft_dir: Path
    target: LoadedTarget
    contract: Contract
    draft: Eagle3Draft


def chat_ids(target: LoadedTarget, text: str) -> list[int]:
    tok = target.tokenizer
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tok(rendered, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def greedy(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    for _ in range(n):
        out.append(int(model(input_ids=torch.tensor([out]), use_cache=False).logits[0, -1].argmax()))
    return out


def train_draft(target: LoadedTarget, contract: Contract, steps: int = TRAIN_STEPS) -> Eagle3Draft:
    """Next-token cross-entropy on the target's greedy continuations of three prompts, plus a second
    step fed the draft's own hidden (so depth 2 gets accepted too)."""
    draft = init_draft(target, contract, seed=1)
    rows = []
    for text in CORPUS[:3]:
        seq = torch.tensor([greedy(target.model, chat_ids(target, text), GREEDY_TOKENS)])
        states = capture(
            target.model,
            seq,
            aux_boundaries=contract.aux_boundaries,
            final=contract.final,
            return_logits=True,
        )
        assert states.logits is not None
        labels = states.logits[0].argmax(-1)
        rows.append((states.aux[:, :-1], seq[:, 1:], labels[1:]))
    params = [p for name, p in draft.named_parameters() if name != "embed_tokens.weight"]
    opt = torch.optim.Adam(params, lr=3e-3)
    draft.train()
    for _ in range(steps):
        loss = torch.zeros(())
        for aux, tokens, labels in rows:
            positions = torch.arange(tokens.shape[1])[None]
            hidden = draft.project(aux)
            first = draft(tokens, hidden, positions)
            loss = loss + F.cross_entropy(first.logits[0], labels)
            fed_back = torch.cat([hidden[:, :1], first.hidden[:, :-1]], dim=1)
            second = draft(tokens, fed_back, positions)
            loss = loss + F.cross_entropy(second.logits[0, 1:], labels[1:])
        opt.zero_grad()
        (loss / len(rows)).backward()
        opt.step()
    return draft.eval().requires_grad_(False)


def build_world(root: Path) -> World:
    target_dir = save_tiny_target(make_tiny_target("llama", num_layers=NUM_LAYERS), root / "target")
    target = load_target(target_dir, dtype="float32")  # as the server loads it: the contract's hashes match
    contract = build_contract(target, AUX_BOUNDARIES)
    draft = train_draft(target, contract)
    draft_dir = save_draft(draft, contract, root / "draft")
    return World(target_dir, draft_dir, target, contract, draft)


class ServerThread:
    """A real server (`eaglewire.serve.server.start_server`) on an event loop in a daemon thread."""

    def __init__(self, served: Any, *, max_queue: int = 4) -> None:
        from eaglewire.serve.server import start_server

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="serve-test-loop", daemon=True)
        self.thread.start()
        self.server = self.call(start_server(served, host="127.0.0.1", port=0, max_queue=max_queue))
        self.url: str = self.server.url

    def call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=60)

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@contextmanager
def running(served: Any, *, max_queue: int = 4) -> Iterator[ServerThread]:
    server = ServerThread(served, max_queue=max_queue)
    try:
        yield server
    finally:
        server.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    url: str, body: Any = None, *, raw: bytes | None = None, method: str | None = None, timeout: float = 60
) -> Answer:
    """One HTTP request with the standard library (a client that shares no code with the server)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, dict(e.headers), e.read())


def sse_events(body: bytes) -> list[Any]:
    """The `data:` payloads of a server-sent event stream (JSON objects, and the final "[DONE]")."""
    events = []
    for block in body.decode("utf-8").split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text (labels: those the sample must have)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        sample_name, _, label_text = head.partition("{")
        if sample_name != name:
            continue
        pairs = dict(p.split("=", 1) for p in label_text.rstrip("}").split(",") if p)
        if all(pairs.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    raise KeyError(f"{name}{labels} not in /metrics")


class Stream:
    """A streaming request read chunk by chunk, that can hang up (http.client: the raw socket)."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        parts = urlsplit(url)
        self.conn = HTTPConnection(parts.hostname, parts.port, timeout=30)
        self.conn.request(
            "POST",
            "/v1/completions",
            json.dumps({**body, "stream": True}),
            {"Content-Type": "application/json"},
        )
        self.response = self.conn.getresponse()
        assert self.response.status == 200

    def next_event(self) -> Any:
        while True:
            line = self.response.fp.readline().decode()
            if line.startswith("data: "):
                return json.loads(line[6:]) if line.strip() != "data: [DONE]" else "[DONE]"

    def hang_up(self) -> None:
        self.conn.close()


def wait_for(predicate: Any, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
