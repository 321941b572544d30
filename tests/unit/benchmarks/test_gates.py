"""benchmarks/h200/gates.py: the quickstart flags full_run.sh takes from a lease's train_profile.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eaglewire.recipes.presets import PRESETS

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "h200" / "gates.py"


GPU = PRESETS["gpu"]


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


def gate(tmp_path: Path, kind: str, rows: list[dict], qs_args: str = "") -> tuple[str, str]:
    path = tmp_path / "train_profile.json"
    path.write_text(json.dumps(rows))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), kind, str(path), qs_args], capture_output=True, text=True, check=True
    )
    return out.stdout, out.stderr


def test_shards_gate_needs_offline_5_percent_faster_at_the_quickstarts_batch(tmp_path: Path) -> None:
    faster = [row("b16 s7", 80_000), row("b16 s7 offline", 90_000, data="offline")]
    flag, why = gate(tmp_path, "shards", faster)
    assert flag == "--train-from-shards" and "1.12x" in why
    assert (
        gate(tmp_path, "shards", [row("b16 s7", 80_000), row("b16 s7 offline", 83_000, data="offline")])[0]
        == ""
    )
    assert gate(tmp_path, "shards", [row("b16 s7", 80_000)])[0] == ""  # no offline row: stays online
    # only rows of the batch size the quickstart trains count
    other = [row("b32 s7", 80_000, batch=32), row("b32 s7 offline", 99_000, batch=32, data="offline")]
    assert gate(tmp_path, "shards", other)[0] == ""
    assert gate(tmp_path, "shards", other, "--batch-size 32")[0] == "--train-from-shards"
    # and of the TTT steps it trains: a 7-step profile does not decide for the gpu preset's 4
    seven = [row("b16 s7", 80_000, ttt=7), row("b16 s7 offline", 99_000, ttt=7, data="offline")]
    flag, why = gate(tmp_path, "shards", seven)
    assert GPU.train.ttt_steps != 7 and flag == "" and f"with {GPU.train.ttt_steps} TTT steps" in why
    assert gate(tmp_path, "shards", seven, "--ttt-steps 7")[0] == "--train-from-shards"
    # a profile whose every setting was skipped says so instead of passing silently
    flag, why = gate(tmp_path, "shards", [])
    assert flag == "" and "no row at batch size 16" in why and "default stays" in why


def test_compile_gate_pays_the_compiles_from_the_budget(tmp_path: Path) -> None:
    rows = [
        row("b16 s7", 80_000),
        row("b16 s7 compiled", 90_000, warmup_s=40.0),
        row("b16 s7 offline", 1, data="offline"),
    ]
    # 30 s more warm-up: 90k * (840 - 30) / (80k * 840) = 1.08x; in a 200 s budget 0.96x
    assert gate(tmp_path, "compile", rows)[0] == "--train-compile"
    assert gate(tmp_path, "compile", rows, "--train-max-seconds 200")[0] == ""


def test_attention_gate_needs_flex_faster_online_and_offline_compiles_paid(tmp_path: Path) -> None:
    rows = [
        row("b16 s7", 100_000),
        row("b16 s7 flex", 130_000, warmup_s=40.0),
        row("b16 s7 offline", 120_000, data="offline"),
        row("b16 s7 flex offline", 160_000, warmup_s=40.0, data="offline"),
    ]
    flag, why = gate(tmp_path, "attention", rows)
    assert flag == "--train-ttt-attention flex" and "1.25x" in why  # 130k * (840 - 30) / (100k * 840)
    # flex slower offline (the recompiling fallback: 618 ms against 98): blocked stays
    slow = [*rows[:3], row("b16 s7 flex offline", 20_000, warmup_s=40.0, data="offline")]
    assert gate(tmp_path, "attention", slow)[0] == ""
    # compiles that eat the gain in a short budget
    assert gate(tmp_path, "attention", rows, "--train-max-seconds 60")[0] == ""
    assert gate(tmp_path, "attention", rows[:1] + rows[2:3])[0] == ""  # no flex rows: nothing to decide
    # flex rows are not online rows without a compiled twin for the compile gate
    assert (
        gate(tmp_path, "compile", [*rows, row("b16 s7 compiled", 120_000, warmup_s=20.0)])[0]
        == "--train-compile"
    )
