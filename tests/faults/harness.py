"""The fault-injection harness: every verdict and every refusal, run through the installed
`eaglewire` console script as a subprocess, on a copy of a real tiny pipeline.

A case is one command line on one workspace: the workspace is a copy of what the tiny quickstart
built (a saved tiny target, its data, shards, vocabulary, training run, draft and exports), into
which `setup` injects the fault exactly where it happens in the field (a truncated file, an edited
config key, a flipped byte). The test asserts three things of every case:

- the exit code the contract requires (README, "Exit codes"): 0 clean, 1 a finding, 2 a refusal;
- every name in `says` appears in the output (the file, flag, tensor or key, and the fix);
- every file that existed before the command has the same sha256 after it. A refusal (exit 2) adds
  nothing either; a finding (1) may add its report; a clean run (0) may add files and replace only
  what `changes` names.

Cases run concurrently (subprocesses, one torch thread each), so the module costs about what its
slowest commands cost on two cores, not their sum.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

INJECT_DIR = Path(__file__).parent / "inject"
# Paths under the workspace that commands may write whatever the case: the cache directory.
SCRATCH = ("home",)


@dataclass(frozen=True)
class Case:
    """One command line and what the contract says must come of it.

    `argv` is the command after `eaglewire`, with `{ws}` for the workspace (a copy per case); it is
    split like a shell would. `says` are substrings the combined stdout and stderr must contain
    (matched case-sensitively, after `{ws}` is filled in). `setup(ws)` injects the fault before the
    command runs. `inject` names an engine fault from tests/faults/inject (an engine bug, simulated
    inside the subprocess, for the checks that exist to catch one). `changes` lists workspace paths
    (files or directories, relative) a clean run is meant to replace."""

    name: str
    argv: str
    exit: int
    says: tuple[str, ...] = ()
    setup: Callable[[Path], None] | None = None
    inject: str | None = None
    changes: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 180.0
    # more assertions on the workspace after the command (e.g. that a stale file is gone)
    then: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class Outcome:
    case: Case
    ws: Path
    returncode: int
    output: str
    before: dict[str, str]
    after: dict[str, str]


def console_script() -> str:
    """The installed `eaglewire` entry point of this interpreter's environment (not `python -m`)."""
    path = Path(sys.executable).parent / "eaglewire"
    found = str(path) if path.exists() else shutil.which("eaglewire")
    if not found:
        raise RuntimeError("the `eaglewire` console script is not installed (pip install -e .)")
    return found


def checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` except the scratch paths, by relative path."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(SCRATCH):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run_case(case: Case, base: Path, ws: Path) -> Outcome:
    shutil.copytree(base, ws, symlinks=True)
    if case.setup is not None:
        case.setup(ws)
    before = checksums(ws)
    env = {
        **os.environ,
        "EAGLEWIRE_HOME": str(ws / "home"),
        "OMP_NUM_THREADS": "1",  # cases run side by side on two cores
        "COLUMNS": "200",  # rich wraps at the terminal width: keep names on one line for `says`
        "NO_COLOR": "1",
        **case.env,
    }
    if case.inject is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(INJECT_DIR), env.get("PYTHONPATH", "")])
        env["EAGLEWIRE_TEST_FAULT"] = case.inject
    argv = [console_script(), *shlex.split(case.argv.format(ws=ws))]
    proc = subprocess.run(
        argv, cwd=ws, env=env, capture_output=True, text=True, timeout=case.timeout_s, check=False
    )
    return Outcome(case, ws, proc.returncode, proc.stdout + proc.stderr, before, checksums(ws))


def check(outcome: Outcome) -> None:
    """The three assertions every case makes (see the module docstring)."""
    case, ws = outcome.case, outcome.ws
    shown = f"eaglewire {case.argv.format(ws=ws)}\n--- output ---\n{outcome.output[-6000:]}"
    assert outcome.returncode == case.exit, f"exit {outcome.returncode}, expected {case.exit}\n{shown}"
    for name in case.says:
        assert name.format(ws=ws) in outcome.output, f"the output does not name {name!r}\n{shown}"
    allowed = tuple(c.rstrip("/") for c in case.changes) if case.exit == 0 else ()

    def free(rel: str) -> bool:
        return any(rel == c or rel.startswith(c + "/") for c in allowed)

    changed = sorted(r for r, h in outcome.before.items() if outcome.after.get(r) != h and not free(r))
    assert not changed, f"files that existed before the command changed or went: {changed}\n{shown}"
    if case.exit == 2:  # a refusal writes nothing (a finding may write its report)
        added = sorted(set(outcome.after) - set(outcome.before))
        assert not added, f"a refused command wrote files: {added}\n{shown}"
    if case.then is not None:
        case.then(ws)
