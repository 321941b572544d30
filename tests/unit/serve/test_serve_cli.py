"""`eaglewire serve` through the installed console script: it answers, writes nothing to the working
directory, and stops cleanly on a signal (SIGINT: 130, the CLI's "interrupted"; SIGTERM: 0)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.faults.harness import console_script
from tests.unit.serve.world import SPEC, World, http

LISTENING = "eaglewire serve: listening on "


def start(world: World, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    cwd.mkdir()
    argv = [console_script(), "serve", "--target", str(world.target_dir), "--draft", str(world.draft_dir),
            "--port", "0", "--device", "cpu", "--served-model-name", "tiny", "--num-steps", str(SPEC.num_steps),
            "--topk", str(SPEC.topk), "--num-draft-tokens", str(SPEC.num_draft_tokens), *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EAGLEWIRE_HOME": str(cwd.parent / f"{cwd.name}-home")}
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def url_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the server prints its URL once it listens
    if not line.startswith(LISTENING):
        proc.kill()
        raise AssertionError(f"no {LISTENING!r} line: {line!r}\n{proc.communicate(timeout=30)[1][-3000:]}")
    return line[len(LISTENING) :].strip()


def test_serve_answers_then_stops_on_a_signal(world: World, tmp_path: Path) -> None:
    """Two servers side by side (start-up is most of the cost): one stopped by SIGINT, one by SIGTERM;
    the second decodes batched (--max-batch 2, the passing way of the flag its refusals test)."""
    expected = {signal.SIGINT: 130, signal.SIGTERM: 0}
    extra = {signal.SIGINT: (), signal.SIGTERM: ("--max-batch", "2")}
    procs = {sig: start(world, tmp_path / sig.name, *extra[sig]) for sig in expected}
    try:
        for sig, proc in procs.items():
            url = url_of(proc)
            assert http(url + "/health").json()["status"] == "ok"
            body = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8, "temperature": 0}
            answer = http(url + "/v1/chat/completions", body)
            assert answer.status == 200 and answer.json()["usage"]["completion_tokens"] == 8
            proc.send_signal(sig)
        errs = {sig: proc.communicate(timeout=60)[1] for sig, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
    for sig, proc in procs.items():
        err = errs[sig]
        assert proc.returncode == expected[sig], f"{sig.name}: {err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]
        assert '"POST /v1/chat/completions" 200 prompt=' in err  # the access log
        assert ("no batch rule measured" in err) == (sig == signal.SIGTERM), err[-3000:]
        assert list((tmp_path / sig.name).iterdir()) == []  # nothing written to the working directory
