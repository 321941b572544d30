"""benchmarks/h200/gates.py: the quickstart flags full_run.sh takes from a lease's train_profile.json
(its `main` in-process; once as a script, as full_run.sh runs it)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from eaglewire.recipes.presets import PRESETS

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "h200" / "gates.py"


GPU = PRESETS["gpu"]
Gate = Callable[..., tuple[str, str]]  # (kind, rows, qs_args="") -> (the flag printed, why)


def row(
    setting: str,
    tokens_per_s: float,
    *,
    batch: int = GPU.train.batch_size,
    ttt: int = GPU.train.ttt_steps,
    warmup_s: float = 10.0,
    data: str = "online",
) -> dict:
    return {
        "setting": setting,
        "batch_size": batch,
        "ttt_steps": ttt,
        "tokens_per_s": tokens_per_s,
        "warmup_s": warmup_s,
        "data": data,
    }


@pytest.fixture(scope="module")
def gates() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gates", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


@pytest.fixture
def gate(gates: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Gate:
    def run(kind: str, rows: list[dict], qs_args: str = "") -> tuple[str, str]:
        path = tmp_path / "train_profile.json"
        path.write_text(json.dumps(rows))
        assert gates.main([kind, str(path), qs_args]) == 0
        out = capsys.readouterr()
        return out.out, out.err

    return run


def test_the_script_prints_the_flag_and_why(tmp_path: Path) -> None:
    """As full_run.sh runs it: the flag on stdout, the reason on stderr, exit 0; an unknown gate exits 2."""
    path = tmp_path / "train_profile.json"
    path.write_text(json.dumps([row("b16 s7", 80_000), row("b16 s7 offline", 90_000, data="offline")]))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "shards", str(path), ""], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, "--train-from-shards") and "1.12x" in done.stderr
    other = subprocess.run(
        [sys.executable, str(SCRIPT), "speed", str(path), ""], capture_output=True, text=True
    )
    assert other.returncode == 2 and "expected one of ['attention', 'compile', 'shards']" in other.stderr


def test_shards_gate_needs_offline_5_percent_faster_at_the_quickstarts_batch(gate: Gate) -> None:
    faster = [row("b16 s7", 80_000), row("b16 s7 offline", 90_000, data="offline")]
    flag, why = gate("shards", faster)
    assert flag == "--train-from-shards" and "1.12x" in why
    assert gate("shards", [row("b16 s7", 80_000), row("b16 s7 offline", 83_000, data="offline")])[0] == ""
    assert gate("shards", [row("b16 s7", 80_000)])[0] == ""  # no offline row: stays online
    # only rows of the batch size the quickstart trains count
    other = [row("b32 s7", 80_000, batch=32), row("b32 s7 offline", 99_000, batch=32, data="offline")]
    assert gate("shards", other)[0] == ""
    assert gate("shards", other, "--batch-size 32")[0] == "--train-from-shards"
    # and of the TTT steps it trains: a 7-step profile does not decide for the gpu preset's 4
    seven = [row("b16 s7", 80_000, ttt=7), row("b16 s7 offline", 99_000, ttt=7, data="offline")]
    flag, why = gate("shards", seven)
    assert GPU.train.ttt_steps != 7 and flag == "" and f"with {GPU.train.ttt_steps} TTT steps" in why
    assert gate("shards", seven, "--ttt-steps 7")[0] == "--train-from-shards"
    # a profile whose every setting was skipped says so instead of passing silently
    flag, why = gate("shards", [])
    assert flag == "" and "no row at batch size 16" in why and "default stays" in why


def test_compile_gate_pays_the_compiles_from_the_budget(gate: Gate) -> None:
    rows = [
        row("b16 s7", 80_000),
        row("b16 s7 compiled", 90_000, warmup_s=40.0),
        row("b16 s7 offline", 1, data="offline"),
    ]
    # 30 s more warm-up: 90k * (840 - 30) / (80k * 840) = 1.08x; in a 200 s budget 0.96x
    assert gate("compile", rows)[0] == "--train-compile"
    assert gate("compile", rows, "--train-max-seconds 200")[0] == ""


def test_attention_gate_needs_flex_faster_online_and_offline_compiles_paid(gate: Gate) -> None:
    rows = [
        row("b16 s7", 100_000),
        row("b16 s7 flex", 130_000, warmup_s=40.0),
        row("b16 s7 offline", 120_000, data="offline"),
        row("b16 s7 flex offline", 160_000, warmup_s=40.0, data="offline"),
    ]
    flag, why = gate("attention", rows)
    assert flag == "--train-ttt-attention flex" and "1.25x" in why  # 130k * (840 - 30) / (100k * 840)
    # flex slower offline (the recompiling fallback: 618 ms against 98): blocked stays
    slow = [*rows[:3], row("b16 s7 flex offline", 20_000, warmup_s=40.0, data="offline")]
    assert gate("attention", slow)[0] == ""
    # compiles that eat the gain in a short budget
    assert gate("attention", rows, "--train-max-seconds 60")[0] == ""
    assert gate("attention", rows[:1] + rows[2:3])[0] == ""  # no flex rows: nothing to decide
    # flex rows are not online rows without a compiled twin for the compile gate
    assert gate("compile", [*rows, row("b16 s7 compiled", 120_000, warmup_s=20.0)])[0] == "--train-compile"
