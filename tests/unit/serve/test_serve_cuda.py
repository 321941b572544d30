"""`eaglewire serve` on CUDA (skipped without it): the decode thread runs the fast runtime's graphed,
launch-ahead rounds, and the served text is still the library's, streamed or not, with cancellation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.serve.loading import LoadOptions, load_served_model
from tests.helpers.tiny import CORPUS
from tests.unit.serve.world import SPEC, Stream, World, http, running, sse_events, wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_served_on_cuda_is_the_library_streamed_or_not_and_cancels(world: World) -> None:
    options = LoadOptions(
        str(world.target_dir), world.draft_dir, "auto", None, None, SPEC, "float32", "cuda", "auto", None
    )
    served = load_served_model(options, "tiny")
    reference = SpeculativeDecoder.load(str(world.target_dir), world.draft_dir, spec=SPEC, device="cuda")
    with running(served) as server:
        for text in CORPUS[:3]:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 64, "temperature": 0}
            whole = http(server.url + "/v1/chat/completions", body).json()
            expected = reference.generate(text, max_new_tokens=64)
            assert whole["choices"][0]["message"]["content"] == expected.text
            assert whole["sglext"]["spec_tokens_details"]["spec_verify_ct"] == expected.num_verifications
            events = sse_events(http(server.url + "/v1/chat/completions", {**body, "stream": True}).body)
            streamed = "".join(
                e["choices"][0]["delta"].get("content", "")
                for e in events
                if isinstance(e, dict) and e["choices"]
            )
            assert streamed == expected.text
        stream = Stream(
            server.url, {"prompt": CORPUS[3], "max_tokens": 400, "temperature": 0, "return_token_ids": True}
        )
        stream.next_event()
        assert stream.next_event()["choices"][0]["token_ids"]
        stream.hang_up()
        wait_for(lambda: server.server.metrics.cancelled == 1 and server.server.queue.running == 0)
        assert server.server.metrics.generation_tokens < 2 * 3 * 64 + 400  # the cancelled one stopped early


def test_the_command_serves_on_cuda_and_stops_on_sigint(world: World, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "eaglewire", "serve", "--target", str(world.target_dir), "--draft",
            str(world.draft_dir), "--port", "0", "--device", "cuda", "--dtype", "bfloat16"]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("eaglewire serve: listening on "), proc.communicate(timeout=60)[1][-3000:]
        url = line.split()[-1]
        body = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32, "temperature": 0}
        assert http(url + "/v1/chat/completions", body).json()["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
