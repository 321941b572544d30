"""`eaglewire data build | vocab | capture | inspect` end to end on the tiny target."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import ShardDataset
from eaglewire.errors import DataFormatError
from tests.helpers.tiny import make_tiny_target, save_tiny_target

runner = CliRunner()


def run(*args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(args), catch_exceptions=True)
    return result


def test_build_vocab_capture_inspect(tmp_path: Path) -> None:
    target_dir = save_tiny_target(make_tiny_target("llama", num_layers=8), tmp_path / "target")
    src = tmp_path / "chat.jsonl"
    rows = [
        {
            "id": f"x{i}",
            "messages": [
                {"role": "user", "content": "Hello! How are you today?"},
                {"role": "assistant", "content": "I am fine, thank you." * (1 + i % 3)},
            ],
        }
        for i in range(5)
    ]
    src.write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"messages": [{"role": "user", "content": "q"}]}\n'
    )
    ds_dir = tmp_path / "ds"
    r = run(
        "data",
        "build",
        "--target",
        str(target_dir),
        "--input",
        str(src),
        "--out",
        str(ds_dir),
        "--max-length",
        "40",
        "--json",
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    counts = json.loads(r.stdout)
    assert counts["records"] == 5 and counts["skipped_no_assistant"] == 1 and counts["truncated_records"] >= 1
    assert len(TokenizedDataset.load(ds_dir)) == 5

    r = run("data", "vocab", "--dataset", str(ds_dir), "--draft-vocab-size", "40")
    assert r.exit_code == 0, r.output
    d2t = load_file(str(ds_dir / "draft_vocab.safetensors"))["draft_to_target"]
    assert d2t.numel() == 40 and bool((d2t[1:] > d2t[:-1]).all())

    sh = tmp_path / "shards"
    r = run(
        "data",
        "capture",
        "--target",
        str(target_dir),
        "--dataset",
        str(ds_dir),
        "--out",
        str(sh),
        "--dtype",
        "float32",
        "--shard-records",
        "2",
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    assert len(ShardDataset(sh)) == 5

    r = run("data", "inspect", str(sh), "--index", "1", "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["record_id"] == "x1" and len(info["boundaries"]) == 4
    assert info["loss_text"].startswith("I am fine, thank you.")
    assert all(len(t["norms"]) == 4 for t in info["tokens"])
    r = run("data", "inspect", str(ds_dir), "--id", "x2", "--target", str(target_dir))
    assert r.exit_code == 0 and "x2" in r.stdout

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"messages": [\n')
    r = run("data", "build", "--target", str(target_dir), "--input", str(bad), "--out", str(tmp_path / "d2"))
    assert isinstance(r.exception, DataFormatError) and "bad.jsonl:2" in str(r.exception)
