"""Every verdict and refusal through the installed `eaglewire` console script, both ways.

The cases live in `cases_*.py` beside this module (one file per area: doctor, outputs, weights,
inputs, verdicts); `harness.py` says what each case asserts and `workspace.py` what it runs on.
The cases start in the background right after collection (`conftest.py`, `background.py`) and
these tests, run last, collect their outcomes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.faults import background
from tests.faults.background import Background
from tests.faults.harness import Case, check, console_script
from tests.faults.workspace import all_cases

CASES = all_cases()


@pytest.fixture(scope="module")
def running() -> Background:
    started = background.started()
    assert started is not None, "tests/faults/conftest.py starts the cases after collection"
    return started


@pytest.fixture(scope="module")
def base(running: Background) -> Path:
    return running.base.result()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault(case: Case, running: Background) -> None:
    check(running.outcomes[case.name].result())


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
