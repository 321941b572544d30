"""benchmarks/draft_levers.py on a saved tiny target: every variant trains a fresh draft for the
same steps with its own fields (aux boundaries included) and is scored by the held-out replay;
a rerun with the same arguments scores nothing again; an unknown field names its variant."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglewire.data.records import TokenizedDataset
from eaglewire.data.vocab import build_draft_vocab, save_draft_vocab
from eaglewire.target.identity import tokenizer_hash
from eaglewire.train.config import TrainConfig
from tests.helpers.tiny import make_tiny_target, save_tiny_target
from tests.unit.train.conftest import make_records

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "draft_levers.py"
SMALL = ["batch_size=2", "max_length=64", "ttt_steps=2", "compile=false", "log_every=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("levers")
    target = make_tiny_target("llama", num_layers=8)
    save_tiny_target(target, root / "target")
    meta = {"tokenizer_hash": tokenizer_hash(target.tokenizer), "tokenizer_vocab_size": target.vocab_size}
    for split, seed, n in (("train", 1, 12), ("eval", 2, 4)):
        records = make_records(target.vocab_size, n, seed=seed)
        TokenizedDataset.from_records(records, meta={**meta, "split": split}).save(
            root / "run" / "data" / split
        )
    train = TokenizedDataset.load(root / "run" / "data" / "train")
    save_draft_vocab(build_draft_vocab(train, 64), root / "run" / "data" / "vocab")
    return root


def levers(
    root: Path, out: Path, *variants: list[str], extra: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(SCRIPT), "--target", str(root / "target"), "--run", str(root / "run"),
            "--preset", "tiny", "--steps", "3", "--device", "cpu", "--chain", "2", "--tree", "2,2,3",
            "--horizon", "16", "--set", *SMALL, "--out", str(out), *(extra or [])]  # fmt: skip
    for v in variants:
        args += ["--variant", *v]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)


def test_variants_train_fresh_drafts_and_a_rerun_skips_them(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "levers.json"
    variants = (
        ["base"],
        ["decay1", "step_weight_decay=1.0"],
        ["aux", "aux_boundaries=1,4,8"],
        ["mix", "source_repeats=rec-1-0:3"],  # make_records' ids have no ':', so each id is its own source
        ["vocab", "draft_vocab_size=96"],
        ["heads", "draft_num_attention_heads=8"],
    )
    done = levers(run_dir, out, *variants)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["base", "decay1", "aux", "mix", "vocab", "heads"]
    for r in rows.values():
        assert r["optimizer_steps"] == 3
        assert 1.0 <= r["tau_chain"] <= 3.0 and 1.0 <= r["tau_tree"] <= 3.0
        assert r["tau_tree_method"] == "dynamic_tree_replay"  # the engine's drafter over the answers
        assert len(r["acc"]) >= 2
    assert rows["decay1"]["overrides"]["step_weight_decay"] == 1.0
    config = json.loads((tmp_path / "levers" / "mix" / "train_config.json").read_text())
    assert config["source_repeats"] == ["rec-1-0:3"]  # one item of a tuple field, as a list
    contract = json.loads((tmp_path / "levers" / "aux" / "draft" / "contract.json").read_text())
    assert contract["aux_boundaries"] == [1, 4, 8]  # the variant's boundaries reached the draft
    assert rows["base"]["draft_vocab_size"] == 64 and rows["vocab"]["draft_vocab_size"] == 96
    assert rows["vocab"]["vocab_coverage"] > rows["base"]["vocab_coverage"]
    vocab_draft = json.loads((tmp_path / "levers" / "vocab" / "draft" / "config.json").read_text())
    assert vocab_draft["draft_vocab_size"] == 96  # the variant's own vocabulary reached the draft
    heads_draft = json.loads((tmp_path / "levers" / "heads" / "draft" / "config.json").read_text())
    assert (heads_draft["num_attention_heads"], heads_draft["num_key_value_heads"]) == (8, 4)  # tiny: 4 / 2
    again = levers(run_dir, out, *variants, extra=["--deadline", "1"])  # the deadline is not part of the key
    assert again.returncode == 0 and "6 variant(s) already scored" in again.stdout
    assert json.loads(out.read_text())["rows"] == list(rows.values())


def test_fit_records_score_the_variant_on_the_text_it_trained_on(run_dir: Path, tmp_path: Path) -> None:
    from eaglewire.predict.evaluation import run_eval

    out = tmp_path / "fit.json"
    done = levers(run_dir, out, ["base"], extra=["--fit-records", "4"])
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["fit_records"] == 4 and len(row["fit_acc"]) == 2  # tiny's ttt_steps=2 (SMALL)
    direct = {
        split: run_eval(draft_dir=tmp_path / "fit" / "base" / "draft", target=str(run_dir / "target"),
                        data_dir=run_dir / "run" / "data" / split, num_steps=2, max_records=4, device="cpu").summary()
        for split in ("train", "eval")
    }  # fmt: skip
    assert row["fit_acc"] == pytest.approx(direct["train"]["acc"])  # the first 4 training records, whole
    # 3 steps leave both accuracies at 0 here: the answer positions scored tell the splits apart
    assert direct["train"]["valid_rows"][0] != direct["eval"]["valid_rows"][0]
    assert row["fit_positions"] == direct["train"]["valid_rows"][0]
    assert "(fit: " in done.stdout


def test_a_variant_that_would_end_after_the_deadline_is_skipped_not_started(
    run_dir: Path, tmp_path: Path
) -> None:
    from benchmarks.draft_levers import seconds_past_deadline

    timed = TrainConfig(max_seconds=200.0)
    assert seconds_past_deadline(0.0, timed, 30.0) is None  # no deadline
    assert seconds_past_deadline(time.time() + 300, timed, None) is None  # the budget alone fits
    assert 25 < seconds_past_deadline(time.time() + 200, timed, 30.0) <= 31  # + the last one's scoring
    assert seconds_past_deadline(time.time() + 20, TrainConfig(max_steps=3), 30.0) > 9  # the last one's wall
    out = tmp_path / "late.json"
    late = levers(run_dir, out, ["base"], ["decay1", "step_weight_decay=1.0"], extra=["--deadline", "1"])
    assert late.returncode == 0, late.stderr[-3000:]
    assert (
        late.stdout.count("skipped, it would end") == 2 and not (tmp_path / "late").exists()
    )  # nothing trained


def test_an_unknown_field_names_its_variant(run_dir: Path, tmp_path: Path) -> None:
    done = levers(run_dir, tmp_path / "x.json", ["bad", "step_wieght_decay=1.0"])
    assert done.returncode == 2
    assert "--variant bad" in done.stderr and "step_wieght_decay" in done.stderr


def test_served_scores_equal_what_the_engine_measures_on_that_text(run_dir: Path, tmp_path: Path) -> None:
    """--served replays each variant's chain over a bench's plain text; decoding those prompts with
    the variant's draft (float32) measures the same tau, round for round."""
    from typer.testing import CliRunner

    from eaglewire.cli import app
    from eaglewire.draft.init import init_draft
    from eaglewire.draft.io import save_draft
    from eaglewire.target.identity import build_contract
    from eaglewire.target.loading import load_target

    target = load_target(run_dir / "target", dtype="float32", device="cpu")
    contract = build_contract(target)
    untrained = save_draft(init_draft(target, contract), contract, tmp_path / "untrained")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hello! How are you?"}\n{"prompt": "What is your favourite book?"}\n')

    def bench(draft: Path, methods: str, out: Path) -> dict:
        r = CliRunner().invoke(app, [
            "bench", "--target", str(run_dir / "target"), "--draft", str(draft), "--prompts", str(prompts),
            "--max-new-tokens", "12", "--methods", methods, "--chain-steps", "2", "--warmup", "0",
            "--repeats", "1", "--device", "cpu", "--no-plots", "--out", str(out),
        ])  # fmt: skip
        assert r.exit_code == 0, r.output
        return json.loads((out / "bench.json").read_text())

    bench(untrained, "plain", tmp_path / "plain")  # the text: any draft's bench serves it
    out = tmp_path / "levers.json"
    done = levers(run_dir, out, ["base"], extra=["--tree", "none", "--served", str(tmp_path / "plain" / "bench.json"),
                                               "--served-dtype", "float32"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["tau_tree"] is None
    served = row["served"]["plain"]  # keyed by the bench's folder
    measured = bench(tmp_path / "levers" / "base" / "draft", "plain,eagle-chain", tmp_path / "chain")
    chain = next(p for p in measured["served_predictions"] if p["method"] == "eagle-chain")
    assert served["tau_chain"] == pytest.approx(chain["measured_tau_in_text"], rel=1e-9)
    assert len(served["chain_acceptance"]) == 2 and served["tau_tree_static"] is None
    # --no-heldout-tree: the tree is replayed on the served text only, the held-out answers are not decoded
    trees = levers(run_dir, tmp_path / "trees.json", ["base"], extra=["--no-heldout-tree", "--served",
                   str(tmp_path / "plain" / "bench.json"), "--served-dtype", "float32"])  # fmt: skip
    assert trees.returncode == 0, trees.stderr[-3000:]
    row = json.loads((tmp_path / "trees.json").read_text())["rows"][0]
    assert row["tau_tree"] is None and row["tau_tree_method"] is None
    assert 1.0 <= row["served"]["plain"]["tau_tree_static"] <= 3.0  # a 2-step tree emits at most 3 a round
    assert "plain tree" in trees.stdout  # the table has the served tree's column


def test_data_shards_trains_from_the_runs_captured_states(run_dir: Path, tmp_path: Path) -> None:
    from eaglewire.data.capture import capture_dataset
    from eaglewire.target.loading import load_target

    root = tmp_path / "root"
    shutil.copytree(run_dir, root)
    out = tmp_path / "levers.json"
    missing = levers(root, out, ["base"], extra=["--data", "shards"])
    assert missing.returncode != 0 and "holds no captured shards" in missing.stderr
    # the shards hold the 4 eval records, the tokenized train split 12: the log says which one trained
    target = load_target(str(root / "target"), dtype="float32", device="cpu")
    eval_records = TokenizedDataset.load(root / "run" / "data" / "eval")
    capture_dataset(target, eval_records, root / "run" / "data" / "train_shards", show_progress=False)
    refused = levers(root, out, ["base"], ["aux", "aux_boundaries=1,4,8"], extra=["--data", "shards"])
    assert refused.returncode != 0 and "variants ['aux'] set aux_boundaries" in refused.stderr
    assert not (tmp_path / "levers").exists()  # refused before any variant trained
    done = levers(root, out, ["base"], extra=["--data", "shards"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 records, " in done.stderr and "12 records, " not in done.stderr
    assert json.loads(out.read_text())["rows"][0]["optimizer_steps"] == 3
