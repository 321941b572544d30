"""Every verdict and refusal through the installed `eaglewire` console script, both ways.

The cases live in `cases_*.py` beside this module (one file per area: doctor, outputs, weights,
inputs, verdicts); `harness.py` says what each case asserts and `workspace.py` what it runs on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.faults.harness import Case, Outcome, check, run_case
from tests.faults.workspace import all_cases, build_base

CASES = all_cases()
# Subprocesses side by side: each is mostly Python start-up and tiny forwards on one thread.
WORKERS = max(2, min(4, (os.cpu_count() or 2) + 1))


@pytest.fixture(scope="module")
def outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Outcome]]]:
    """Start every selected case at once (after building the base workspace); each test waits for its own."""
    base = build_base(tmp_path_factory.mktemp("fault-base") / "ws")
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
