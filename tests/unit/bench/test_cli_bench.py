"""`eaglewire bench` through the CLI: a saved tiny target directory, a JSONL prompt file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.types import TokenizedRecord
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.errors import ConfigError
from eaglewire.target.identity import build_contract, tokenizer_hash
from eaglewire.target.loading import load_target
from tests.helpers.tiny import save_tiny_target

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tiny_target, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("cli")
    target_dir = save_tiny_target(tiny_target, root / "target")
    loaded = load_target(target_dir, dtype="float32", device="cpu")
    contract = build_contract(loaded)
    draft_dir = save_draft(init_draft(loaded, contract), contract, root / "draft")
    gen = torch.Generator().manual_seed(0)
    records = [
        TokenizedRecord(
            f"r{i}",
            torch.randint(3, loaded.vocab_size, (16,), generator=gen),
            torch.ones(16, dtype=torch.bool),
        )
        for i in range(3)
    ]
    meta = {"split": "eval", "tokenizer_hash": tokenizer_hash(loaded.tokenizer)}
    TokenizedDataset.from_records(records, meta=meta).save(root / "heldout")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "Hello! How are you?"}\n{"prompt": "What is your favourite book?"}\n{"prompt": "x"}\n'
    )
    return {"target": target_dir, "draft": draft_dir, "prompts": prompts, "root": root}


def test_bench_json(files: dict[str, Path]) -> None:
    out = files["root"] / "bench"
    r = runner.invoke(app, [
        "bench", "--target", str(files["target"]), "--draft", str(files["draft"]), "--prompts", str(files["prompts"]),
        "--num-prompts", "2", "--max-new-tokens", "5", "--methods", "plain,eagle-chain,hf-static-compiled",
        "--chain-steps", "2", "--warmup", "0", "--repeats", "1", "--device", "cpu", "--out", str(out), "--json",
        "--eval-data", str(files["root"] / "heldout"),
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert list(data["methods"]) == ["plain", "eagle-chain", "hf-static-compiled"]
    assert data["num_prompts"] == 2 and data["dtype"] == "float32"
    assert data["methods"]["eagle-chain"]["greedy_matches_reference"] is True
    assert data["command"].startswith("eaglewire ")
    assert (out / "bench.md").exists() and (out / "throughput.png").exists()
    (pred,) = data[
        "predictions"
    ]  # the offline evaluation ran on --eval-data: predicted vs measured for the chain
    assert pred["num_steps"] == 2 and pred["predicted_tau"] >= 1.0
    assert pred["error"] == pytest.approx(pred["measured_tau"] - pred["predicted_tau"])
    # on by default with a draft: the replay over the served text, beside the held-out prediction
    (served,) = data["served_predictions"]
    assert served["method"] == "eagle-chain" and served["heldout_predicted_tau"] == pred["predicted_tau"]
    assert served["rounds_match"] and served["served_predicted_tau"] == served["measured_tau_in_text"]


def test_bench_refuses_a_negative_eval_answer(files: dict[str, Path]) -> None:
    r = runner.invoke(app, [
        "bench", "--target", str(files["target"]), "--draft", str(files["draft"]), "--prompts", str(files["prompts"]),
        "--device", "cpu", "--eval-data", str(files["root"] / "heldout"), "--eval-answer", "-1",
    ])  # fmt: skip
    assert r.exit_code != 0 and isinstance(r.exception, ConfigError)
    assert "--eval-answer" in str(r.exception) and "got -1" in str(r.exception)


def test_bench_no_served_prediction(files: dict[str, Path]) -> None:
    r = runner.invoke(app, [
        "bench", "--target", str(files["target"]), "--draft", str(files["draft"]), "--prompts", str(files["prompts"]),
        "--num-prompts", "1", "--max-new-tokens", "3", "--methods", "eagle-chain", "--chain-steps", "2",
        "--warmup", "0", "--repeats", "1", "--device", "cpu", "--out", str(files["root"] / "off"), "--json",
        "--no-plots", "--no-served-prediction",
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["served_predictions"] == [] and data["served_prediction_summary"] == {"settings_compared": 0}
    assert "--no-served-prediction" in data["command"]


def test_bench_sweep_writes_best_setting(files: dict[str, Path]) -> None:
    out = files["root"] / "sweep"
    r = runner.invoke(app, [
        "bench", "--target", str(files["target"]), "--draft", str(files["draft"]), "--prompts", str(files["prompts"]),
        "--num-prompts", "1", "--max-new-tokens", "4", "--sweep", "--sweep-num-steps", "1,2", "--sweep-topk", "1",
        "--warmup", "0", "--device", "cpu", "--out", str(out), "--no-plots",
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    best = json.loads((files["draft"] / "best_setting.json").read_text())
    assert best["topk"] == 1 and best["num_draft_tokens"] == best["num_steps"] + 1 and best["batch_size"] == 1
    assert "eaglewire bench" in best["source"] and "cpu" in best["source"]
    assert (out / "sweep.json").exists() and "Fastest per batch size" in r.stdout


def test_bench_bad_method(files: dict[str, Path]) -> None:
    r = runner.invoke(app, ["bench", "--target", str(files["target"]), "--prompts", str(files["prompts"]),
                            "--methods", "plain,vllm", "--device", "cpu"])  # fmt: skip
    assert isinstance(r.exception, ConfigError) and "unknown ['vllm']" in str(r.exception)


def test_export_reads_the_best_setting(files: dict[str, Path]) -> None:
    from eaglewire.export.launch import resolve_spec_args

    path = files["draft"] / "best_setting.json"
    if not path.exists():
        pytest.skip("runs after test_bench_sweep_writes_best_setting")
    best = json.loads(path.read_text())
    spec, source = resolve_spec_args(draft_dir=files["draft"])
    assert (spec.num_steps, spec.topk, spec.num_draft_tokens) == (
        best["num_steps"],
        best["topk"],
        best["num_draft_tokens"],
    )
    assert "best_setting.json" in source


def test_greedy_difference_is_a_finding_in_float32_only(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from eaglewire.cli.bench import _greedy_finding

    with pytest.raises(typer.Exit) as e:
        _greedy_finding("eagle-tree: 1 prompt(s)", "float32")
    assert e.value.exit_code == 1
    _greedy_finding("eagle-tree: 1 prompt(s)", "bfloat16")
    err = capsys.readouterr().err
    assert "NOT LOSSLESS: eagle-tree" in err and "warning: eagle-tree" in err and "--dtype float32" in err
