"""The fault cases run in the background while the rest of the suite runs.

Most unit tests run on one thread, so on CI's two cores one core idles for minutes; the fault cases
are subprocesses (Python start-up and tiny forwards). `conftest.py` starts them right after
collection: the base workspace is built by a subprocess, then every selected case runs on a small
pool of threads, each waiting on its own subprocess. The fault tests themselves are moved to the end
of the run, where they only collect the outcomes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tests.faults.harness import Case, Outcome, run_case

REPO = Path(__file__).resolve().parents[2]
WORKERS = 1  # beside the main pytest process: two cores, and most unit tests use one


class Background:
    def __init__(self, cases: list[Case]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eaglewire-faults-"))
        self.pool = ThreadPoolExecutor(max_workers=WORKERS)
        self.base: Future[Path] = self.pool.submit(self._build, self.root / "base")
        self.outcomes: dict[str, Future[Outcome]] = {c.name: self.pool.submit(self._run, c) for c in cases}

    def _build(self, base: Path) -> Path:
        code = "import sys; from pathlib import Path; from tests.faults.workspace import build_base; build_base(Path(sys.argv[1]))"
        proc = subprocess.run(
            [sys.executable, "-c", code, str(base)], cwd=REPO, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"building the fault workspace failed:\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}"
            )
        return base

    def _run(self, case: Case) -> Outcome:
        base = self.base.result()
        return run_case(case, base, self.root / "cases" / case.name.replace(":", "-").replace("/", "-"))

    def close(self) -> None:
        for f in self.outcomes.values():
            f.cancel()
        self.pool.shutdown(wait=True)
        shutil.rmtree(self.root, ignore_errors=True)


_STARTED: list[Background] = []


def start(cases: list[Case]) -> Background:
    _STARTED.append(Background(cases))
    return _STARTED[-1]


def started() -> Background | None:
    return _STARTED[-1] if _STARTED else None


def close_all() -> None:
    while _STARTED:
        _STARTED.pop().close()
