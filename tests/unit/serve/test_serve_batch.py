"""`eaglewire serve --max-batch N` over real HTTP on 127.0.0.1 (issue 53 item 2): requests decoded together
return exactly the tokens each returns alone (greedy, float32), each with its own spec statistics; the
vLLM gauges count the rows decoding and the requests waiting; a client that hangs up frees its row for the
next waiting request; the batch rule is shown at start."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.serve.loading import LoadOptions, ServedModel, load_served_model
from tests.helpers.tiny import CORPUS
from tests.unit.serve.world import SPEC, ServerThread, Stream, World, http, metric, running, wait_for

MAX_BATCH = 4


def options(world: World, **changes: Any) -> LoadOptions:
    base = LoadOptions(
        target=str(world.target_dir), draft=world.draft_dir, engine="auto", sglang_version=None,
        vllm_version=None, spec=SPEC, dtype="float32", device="cpu", runner="auto", context_length=None,
        max_batch=MAX_BATCH,
    )  # fmt: skip
    return replace(base, **changes)


@pytest.fixture(scope="module")
def batched(world: World) -> ServedModel:
    return load_served_model(options(world), "tiny")


@pytest.fixture(scope="module")
def server(batched: ServedModel) -> Iterator[ServerThread]:
    with running(batched, max_queue=8) as s:
        yield s


@pytest.fixture(scope="module")
def reference(world: World) -> SpeculativeDecoder:
    return SpeculativeDecoder.load(str(world.target_dir), world.draft_dir, spec=SPEC, dtype="float32")


# six requests for four rows: two wait, then take the rows the first to finish free
REQUESTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": CORPUS[i % 4]}], "max_tokens": n})
    for i, n in enumerate((40, 12, 33, 25, 8, 30))
]


def test_concurrent_greedy_requests_equal_each_alone(
    server: ServerThread, reference: SpeculativeDecoder
) -> None:
    """Six clients at once on four rows: each gets the tokens `generate` gives it alone, and its
    sglext.spec_tokens_details are its own rounds' (the same verifications and acceptance as alone)."""
    bodies = [{**b, "temperature": 0, "return_token_ids": True} for _, b in REQUESTS]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: http(server.url + "/v1/chat/completions", b), bodies))
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.status == 200, answer.body
        got = answer.json()
        alone = reference.generate(body["messages"][0]["content"], max_new_tokens=body["max_tokens"])
        assert got["choices"][0]["token_ids"] == alone.token_ids
        assert got["choices"][0]["message"]["content"] == alone.text
        details = got["sglext"]["spec_tokens_details"]
        assert details["spec_verify_ct"] == alone.num_verifications
        assert details["spec_num_correct_drafts"] == sum(alone.accepted_per_round)
        histogram = [alone.accepted_per_round.count(k) for k in range(max(alone.accepted_per_round) + 1)]
        assert details["spec_correct_drafts_histogram"] == histogram
    assert server.server.queue.running == server.server.queue.waiting == 0


LONG = {"prompt": CORPUS[3], "max_tokens": 400, "temperature": 0, "return_token_ids": True}


def gauges(server: ServerThread) -> tuple[float, float]:
    text = http(server.url + "/metrics").body.decode()
    return (
        metric(text, "vllm:num_requests_running", model_name="tiny"),
        metric(text, "vllm:num_requests_waiting", model_name="tiny"),
    )


def test_gauges_and_a_hang_up_frees_its_row(server: ServerThread) -> None:
    """Four streams fill the rows (running 4), a fifth request waits (waiting 1); the first stream's
    client hangs up: its row is freed within a round, the waiting request is admitted and answered,
    and the metrics count one cancellation."""
    metrics = server.server.metrics
    cancelled = metrics.cancelled
    streams = [Stream(server.url, LONG) for _ in range(MAX_BATCH)]
    for stream in streams:
        stream.next_event()  # the prompt's ids
        assert stream.next_event()["choices"][0]["token_ids"]  # decoding
    assert gauges(server) == (MAX_BATCH, 0)
    answers: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answers.append(http(server.url + "/v1/completions", {"prompt": "a", "max_tokens": 4}))
    )
    waiter.start()
    wait_for(lambda: server.server.queue.waiting == 1)
    assert gauges(server) == (MAX_BATCH, 1)
    streams[0].hang_up()
    waiter.join(timeout=30)
    assert answers and answers[0].status == 200, answers
    wait_for(lambda: metrics.cancelled == cancelled + 1)
    running_now, waiting_now = gauges(server)
    assert waiting_now == 0 and running_now <= MAX_BATCH - 1  # three streams at most (one may have ended)
    for stream in streams[1:]:
        stream.hang_up()
    wait_for(lambda: server.server.queue.running + server.server.queue.waiting == 0)
    assert gauges(server) == (0, 0)


def test_the_batch_rule_is_shown_at_start(
    batched: ServedModel,
    world: World,
    reference: SpeculativeDecoder,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No rule for this device: one line naming the command that measures one. With one whose costs say
    plain decoding at every batch size: its table is logged and rounds decode plainly (no drafts in the
    spec statistics, the tokens unchanged)."""
    from eaglewire.bench.report import describe_device
    from eaglewire.engine.batch.engine import setting_label
    from eaglewire.predict.by_batch import BatchRule, rule_path

    with caplog.at_level(logging.INFO, logger="eaglewire.serve.batch_worker"), running(batched):
        pass
    assert "no batch rule measured for cpu" in caplog.text
    assert (
        f"eaglewire bench --target {world.target_dir} --draft {world.draft_dir} --batch-sizes" in caplog.text
    )

    label = setting_label(SPEC)
    rule = BatchRule(
        device=describe_device("cpu"), dtype="float32", taus={label: 1.5},
        round_seconds={"plain": {1: 0.001, 8: 0.002}, label: {1: 0.01, 8: 0.02}},
    )  # fmt: skip
    draft = Path(shutil.copytree(world.draft_dir, tmp_path / "draft"))  # the world's own stays as it is
    rule.save(rule_path(draft, describe_device("cpu")))
    ruled = load_served_model(options(world, draft=draft), "tiny")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="eaglewire.serve.batch_worker"), running(ruled) as s:
        body = {"messages": [{"role": "user", "content": CORPUS[0]}], "max_tokens": 16, "temperature": 0}
        got = http(s.url + "/v1/chat/completions", {**body, "return_token_ids": True}).json()
    assert "decoding by the batch rule" in caplog.text and "-> plain" in caplog.text
    assert got["sglext"]["spec_tokens_details"]["spec_verify_ct"] == 0
    assert got["choices"][0]["token_ids"] == reference.generate(CORPUS[0], max_new_tokens=16).token_ids
