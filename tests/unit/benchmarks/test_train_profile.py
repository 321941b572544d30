"""benchmarks/train_profile.py: its defaults time the step the gpu quickstart trains, and the rows it
writes are the ones benchmarks/h200/gates.py decides the quickstart's flags from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from benchmarks.train_profile import build_parser, main

from eaglewire.recipes.presets import PRESETS

ROOT = Path(__file__).resolve().parents[3]
GATES = ROOT / "benchmarks" / "h200" / "gates.py"


def test_defaults_follow_the_gpu_preset() -> None:
    args, gpu = build_parser().parse_args([]), PRESETS["gpu"]
    assert (args.ttt_steps, args.batch_sizes, args.max_length, args.vd) == (
        gpu.train.ttt_steps,
        [gpu.train.batch_size],
        gpu.train.max_length,
        gpu.data.draft_vocab_size,
    )


def test_tiny_profile_rows_feed_the_gates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "train_profile.json"
    main(["--tiny", "--data", "online,offline", "--out", str(out)])
    rows = {r["setting"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"b2 s2", "b2 s2 offline"}
    assert all(r["tokens_per_s"] > 0 and r["step_ms"] > 0 for r in rows.values())
    assert "b2 s2 offline | " in capsys.readouterr().out  # the table's row
    # the tiny profile trains 2 rows of 2 TTT steps: the gates see its rows only when told that step
    spec = importlib.util.spec_from_file_location("gates", GATES)
    assert spec is not None and spec.loader is not None
    gates = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gates)
    for qs_args, seen in (("--batch-size 2 --ttt-steps 2", True), ("--batch-size 2", False)):
        assert gates.main(["shards", str(out), qs_args]) == 0
        gate = capsys.readouterr()
        online = f"{rows['b2 s2']['tokens_per_s']:.0f} tok/s"
        assert (f"shards gate: b2 s2: online {online}, offline" in gate.err) is seen, gate.err
        assert gate.out in ("", "--train-from-shards")
