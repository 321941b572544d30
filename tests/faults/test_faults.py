"""Every verdict and refusal through the installed `eaglewire` console script, both ways.

The cases live in `cases_*.py` beside this module (one file per area: doctor, outputs, weights,
inputs, verdicts); `harness.py` says what each case asserts and `workspace.py` what it runs on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.faults.harness import Case, Outcome, check, console_script, run_case
from tests.faults.workspace import all_cases, build_base

CASES = all_cases()
# Subprocesses side by side: each is mostly Python start-up and tiny forwards on one thread.
WORKERS = max(2, min(4, (os.cpu_count() or 2) + 1))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_base(tmp_path_factory.mktemp("fault-base") / "ws")


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base: Path
) -> Iterator[dict[str, Future[Outcome]]]:
    """Start every selected case at once; each test waits for its own."""
    selected = {
        item.callspec.params["case"].name
        for item in request.session.items
        if getattr(item, "callspec", None) is not None and isinstance(item.callspec.params.get("case"), Case)
    }
    root = tmp_path_factory.mktemp("fault-cases")
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = {
            c.name: pool.submit(run_case, c, base, root / c.name.replace(":", "-").replace("/", "-"))
            for c in CASES
            if c.name in selected
        }
        yield futures
        for f in futures.values():
            f.cancel()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault(case: Case, outcomes: dict[str, Future[Outcome]]) -> None:
    check(outcomes[case.name].result())


def test_interrupted_exits_130(base: Path, tmp_path: Path) -> None:
    """Ctrl-C in the middle of a command: exit 130, and no traceback."""
    ws = tmp_path / "ws"
    shutil.copytree(base, ws)
    (ws / "many.txt").write_text("Hello! How are you today?\n" * 200, encoding="utf-8")
    env = {**os.environ, "EAGLEWIRE_HOME": str(ws / "home"), "OMP_NUM_THREADS": "1"}
    argv = [console_script(), "generate", "--target", str(ws / "target"), "--draft", str(ws / "qs/train/draft"),
            "--prompts-file", str(ws / "many.txt"), "--max-new-tokens", "64", "--device", "cpu"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first prompt is done: the command is decoding
        assert first.startswith("--- prompt 0"), first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
