"""benchmarks/train_profile.py: its defaults time the step the gpu quickstart trains, and the rows it
writes are the ones benchmarks/h200/gates.py decides the quickstart's flags from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from eaglewire.recipes.presets import PRESETS

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}


def test_defaults_follow_the_gpu_preset() -> None:
    from benchmarks.train_profile import build_parser

    args, gpu = build_parser().parse_args([]), PRESETS["gpu"]
    assert (args.ttt_steps, args.batch_sizes, args.max_length, args.vd) == (
        gpu.train.ttt_steps,
        [gpu.train.batch_size],
        gpu.train.max_length,
        gpu.data.draft_vocab_size,
    )


def test_tiny_profile_rows_feed_the_gates(tmp_path: Path) -> None:
    out = tmp_path / "train_profile.json"
    script = ROOT / "benchmarks" / "train_profile.py"
    done = subprocess.run(
        [sys.executable, str(script), "--tiny", "--data", "online,offline", "--out", str(out)],
        capture_output=True, text=True, env=ENV, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["setting"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"b2 s2", "b2 s2 offline"}
    assert all(r["tokens_per_s"] > 0 and r["step_ms"] > 0 for r in rows.values())
    # the tiny profile trains 2 rows of 2 TTT steps: the gates see its rows only when told that step
    gates = ROOT / "benchmarks" / "h200" / "gates.py"
    for qs_args, seen in (("--batch-size 2 --ttt-steps 2", True), ("--batch-size 2", False)):
        gate = subprocess.run(
            [sys.executable, str(gates), "shards", str(out), qs_args],
            capture_output=True, text=True, env=ENV, timeout=120, check=True,
        )  # fmt: skip
        online = f"{rows['b2 s2']['tokens_per_s']:.0f} tok/s"
        assert (f"shards gate: b2 s2: online {online}, offline" in gate.stderr) is seen, gate.stderr
        assert gate.stdout in ("", "--train-from-shards")
