"""benchmarks/capture_speed.py --tiny (the script's own CPU check, issue 4's capture benchmark): every row
runs, each capture_dataset variant writes the shards its settings ask for, and nothing is left in the
work folders."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def test_every_row_runs_and_each_dataset_variant_writes_its_own_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as a script: its folder on sys.path (capture_speed_rows)
    main = importlib.import_module("capture_speed").main
    work, second = tmp_path / "work", tmp_path / "second"
    out = tmp_path / "capture.json"
    args = ["--tiny", "--records", "16", "--max-tokens", "3000", "--repeats", "1", "--dataset-repeats", "1",
            "--dataset-shard-records", "4", "--dataset-max-window-batches", "1", "--second-work", str(second),
            "--work", str(work), "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    memory = ["prefill", "prefill_no_cudnn", "prefill_unmasked", "capture_masked", "capture_states",
              "capture_copies", "capture_records_by_shard", "capture_records", "capture_pipelined"]  # fmt: skip
    writers = ["write_shards", "write_raw", "sha256_only"]
    dataset = ["capture_dataset", "capture_dataset_shards4", "capture_dataset_maxwindow1", "capture_dataset_second",
               "capture_dataset_pace0", "capture_dataset_pace1", "capture_dataset_switch"]  # fmt: skip
    assert list(rows) == [*memory, *writers, *(w + "_second" for w in writers), *dataset]
    assert all(r["tokens"] == result["tokens"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())
    records, default = result["records"], result["shard_records"]
    for name in dataset:
        expected = math.ceil(records / (4 if name.endswith("shards4") else default))
        assert rows[name]["shards"] == expected, name
    # the same states whatever the shard size or pace: only the shard headers' share may differ
    sizes = {rows[n]["written_bytes"] for n in dataset if n != "capture_dataset_shards4"}
    assert len(sizes) == 1
    assert result["baseline_row"].startswith("prefill") and result["goal_ratio"] == 0.70
    assert "| capture_dataset_shards4 | 4 |" in capsys.readouterr().out
    assert not any(work.iterdir()) and not any(second.iterdir())  # every fresh folder removed again
