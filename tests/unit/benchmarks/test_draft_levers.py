"""benchmarks/draft_levers.py on a saved tiny target: every variant trains a fresh draft for the
same steps with its own fields (aux boundaries included) and is scored by the held-out replay, on
the records it trained on (--fit-records) and on a bench's served text (--served); a rerun with the
same arguments scores nothing again; a variant past the deadline is skipped; an unknown field names
its variant; --data shards trains from the run's captured states.

One end-to-end run (`levers`, module-scoped) serves every assertion about the scored rows; the script
runs in-process (its `main`) except once, to check its exit status on bad input."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from benchmarks.draft_levers import main, seconds_past_deadline
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.vocab import build_draft_vocab, save_draft_vocab
from eaglewire.errors import ConfigError
from eaglewire.target.identity import tokenizer_hash
from eaglewire.train.config import TrainConfig
from tests.helpers.tiny import make_tiny_target, save_tiny_target
from tests.unit.train.conftest import make_records

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "draft_levers.py"
SMALL = ["batch_size=2", "max_length=64", "ttt_steps=2", "compile=false", "log_every=1"]
VARIANTS = (
    ["base"],
    ["decay1", "step_weight_decay=1.0"],
    ["aux", "aux_boundaries=1,4,8"],
    ["mix", "source_repeats=rec-1-0:3"],  # make_records' ids have no ':', so each id is its own source
    ["vocab", "draft_vocab_size=96"],
    ["heads", "draft_num_attention_heads=8"],
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny target and a quickstart-like run: tokenized train (12) and eval (4) splits and a vocabulary."""
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


def levers_args(root: Path, out: Path, *variants: list[str], extra: list[str] | None = None) -> list[str]:
    args = ["--target", str(root / "target"), "--run", str(root / "run"), "--preset", "tiny", "--steps", "3",
            "--device", "cpu", "--chain", "2", "--tree", "2,2,3", "--horizon", "16", "--set", *SMALL,
            "--out", str(out), *(extra or [])]  # fmt: skip
    for v in variants:
        args += ["--variant", *v]
    return args


def bench(run_dir: Path, draft: Path, prompts: Path, methods: str, out: Path) -> dict[str, Any]:
    r = CliRunner().invoke(app, [
        "bench", "--target", str(run_dir / "target"), "--draft", str(draft), "--prompts", str(prompts),
        "--max-new-tokens", "12", "--methods", methods, "--chain-steps", "2", "--warmup", "0",
        "--repeats", "1", "--device", "cpu", "--no-plots", "--out", str(out),
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    return json.loads((out / "bench.json").read_text())


@dataclass
class Levers:
    root: Path  # the module's temporary folder: plain/ (the served bench), levers/ (each variant's run)
    args: list[str]
    rows: dict[str, dict[str, Any]]
    stdout: str


@pytest.fixture(scope="module")
def levers(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Levers:
    """Every variant, scored held out (chain and tree), on its first 4 training records, and on the plain
    text a bench of an untrained draft served (any draft's bench serves the target's own greedy text)."""
    from eaglewire.draft.init import init_draft
    from eaglewire.draft.io import save_draft
    from eaglewire.target.identity import build_contract
    from eaglewire.target.loading import load_target

    root = tmp_path_factory.mktemp("levers_run")
    target = load_target(run_dir / "target", dtype="float32", device="cpu")
    contract = build_contract(target)
    untrained = save_draft(init_draft(target, contract), contract, root / "untrained")
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hello! How are you?"}\n{"prompt": "What is your favourite book?"}\n')
    bench(run_dir, untrained, prompts, "plain", root / "plain")
    extra = [
        "--fit-records",
        "4",
        "--served",
        str(root / "plain" / "bench.json"),
        "--served-dtype",
        "float32",
    ]
    args = levers_args(run_dir, root / "levers.json", *VARIANTS, extra=extra)
    with contextlib.redirect_stdout(io.StringIO()) as stdout:  # capsys is per test, this run per module
        assert main(args) == 0
    rows = {r["variant"]: r for r in json.loads((root / "levers.json").read_text())["rows"]}
    return Levers(root, args, rows, stdout.getvalue())


def test_variants_train_fresh_drafts_with_their_own_fields(levers: Levers) -> None:
    rows, root = levers.rows, levers.root
    assert list(rows) == ["base", "decay1", "aux", "mix", "vocab", "heads"]
    for r in rows.values():
        assert r["optimizer_steps"] == 3
        assert 1.0 <= r["tau_chain"] <= 3.0 and 1.0 <= r["tau_tree"] <= 3.0
        assert r["tau_tree_method"] == "dynamic_tree_replay"  # the engine's drafter over the answers
        assert len(r["acc"]) >= 2
    assert rows["decay1"]["overrides"]["step_weight_decay"] == 1.0
    config = json.loads((root / "levers" / "mix" / "train_config.json").read_text())
    assert config["source_repeats"] == ["rec-1-0:3"]  # one item of a tuple field, as a list
    contract = json.loads((root / "levers" / "aux" / "draft" / "contract.json").read_text())
    assert contract["aux_boundaries"] == [1, 4, 8]  # the variant's boundaries reached the draft
    assert rows["base"]["draft_vocab_size"] == 64 and rows["vocab"]["draft_vocab_size"] == 96
    assert rows["vocab"]["vocab_coverage"] > rows["base"]["vocab_coverage"]
    vocab_draft = json.loads((root / "levers" / "vocab" / "draft" / "config.json").read_text())
    assert vocab_draft["draft_vocab_size"] == 96  # the variant's own vocabulary reached the draft
    heads_draft = json.loads((root / "levers" / "heads" / "draft" / "config.json").read_text())
    assert (heads_draft["num_attention_heads"], heads_draft["num_key_value_heads"]) == (8, 4)  # tiny: 4 / 2


def test_a_rerun_with_the_same_arguments_scores_nothing_again(
    levers: Levers, capsys: pytest.CaptureFixture[str]
) -> None:
    out = levers.root / "levers.json"
    before = out.read_text()
    assert main([*levers.args, "--deadline", "1"]) == 0  # the deadline is not part of the key
    assert "6 variant(s) already scored" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"] == json.loads(before)["rows"]


def test_fit_records_score_the_variant_on_the_text_it_trained_on(levers: Levers, run_dir: Path) -> None:
    from eaglewire.predict.evaluation import run_eval

    row = levers.rows["base"]
    assert row["fit_records"] == 4 and len(row["fit_acc"]) == 2  # tiny's ttt_steps=2 (SMALL)
    direct = {
        split: run_eval(draft_dir=levers.root / "levers" / "base" / "draft", target=str(run_dir / "target"),
                        data_dir=run_dir / "run" / "data" / split, num_steps=2, max_records=4, device="cpu").summary()
        for split in ("train", "eval")
    }  # fmt: skip
    assert row["fit_acc"] == pytest.approx(direct["train"]["acc"])  # the first 4 training records, whole
    # 3 steps leave both accuracies at 0 here: the answer positions scored tell the splits apart
    assert direct["train"]["valid_rows"][0] != direct["eval"]["valid_rows"][0]
    assert row["fit_positions"] == direct["train"]["valid_rows"][0]
    assert "(fit: " in levers.stdout


def test_served_scores_equal_what_the_engine_measures_on_that_text(levers: Levers, run_dir: Path) -> None:
    """--served replays each variant's chain over a bench's plain text; decoding those prompts with
    the variant's draft (float32) measures the same tau, round for round."""
    served = levers.rows["base"]["served"]["plain"]  # keyed by the bench's folder
    measured = bench(run_dir, levers.root / "levers" / "base" / "draft", levers.root / "prompts.jsonl",
                     "plain,eagle-chain", levers.root / "chain")  # fmt: skip
    chain = next(p for p in measured["served_predictions"] if p["method"] == "eagle-chain")
    assert served["tau_chain"] == pytest.approx(chain["measured_tau_in_text"], rel=1e-9)
    assert len(served["chain_acceptance"]) == 2
    assert 1.0 <= served["tau_tree_static"] <= 3.0  # a 2-step tree emits at most 3 a round
    assert "plain tree" in levers.stdout  # the table has the served tree's column


def test_a_variant_that_would_end_after_the_deadline_is_skipped_not_started(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timed = TrainConfig(max_seconds=200.0)
    assert seconds_past_deadline(0.0, timed, 30.0) is None  # no deadline
    assert seconds_past_deadline(time.time() + 300, timed, None) is None  # the budget alone fits
    assert 25 < seconds_past_deadline(time.time() + 200, timed, 30.0) <= 31  # + the last one's scoring
    assert seconds_past_deadline(time.time() + 20, TrainConfig(max_steps=3), 30.0) > 9  # the last one's wall
    args = levers_args(run_dir, tmp_path / "late.json", ["base"], ["decay1", "step_weight_decay=1.0"],
                       extra=["--deadline", "1"])  # fmt: skip
    assert main(args) == 0
    assert capsys.readouterr().out.count("skipped, it would end") == 2
    assert not (tmp_path / "late").exists()  # nothing trained


def test_an_unknown_field_names_its_variant_and_exits_2(run_dir: Path, tmp_path: Path) -> None:
    """The one run as a script: bad input exits with the CLI's status 2 and the error on stderr."""
    args = levers_args(run_dir, tmp_path / "x.json", ["bad", "step_wieght_decay=1.0"])
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "--variant bad" in done.stderr and "step_wieght_decay" in done.stderr


def test_data_shards_trains_from_the_runs_captured_states(
    run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from eaglewire.data.capture import capture_dataset
    from eaglewire.target.loading import load_target

    root = tmp_path / "root"
    shutil.copytree(run_dir, root)
    out = tmp_path / "levers.json"
    with pytest.raises(ConfigError, match="holds no captured shards"):
        main(levers_args(root, out, ["base"], extra=["--data", "shards"]))
    # the shards hold the 4 eval records, the tokenized train split 12: the log says which one trained
    target = load_target(str(root / "target"), dtype="float32", device="cpu")
    eval_records = TokenizedDataset.load(root / "run" / "data" / "eval")
    capture_dataset(target, eval_records, root / "run" / "data" / "train_shards", show_progress=False)
    with pytest.raises(ConfigError, match=r"variants \['aux'\] set aux_boundaries"):
        main(levers_args(root, out, ["base"], ["aux", "aux_boundaries=1,4,8"], extra=["--data", "shards"]))
    assert not (tmp_path / "levers").exists()  # refused before any variant trained
    # --no-heldout-tree: the held-out answers are not decoded with the tree (without --served: no tree at all)
    with caplog.at_level("INFO"):
        assert main(levers_args(root, out, ["base"], extra=["--data", "shards", "--no-heldout-tree"])) == 0
    assert "4 records, " in caplog.text and "12 records, " not in caplog.text
    (row,) = json.loads(out.read_text())["rows"]
    assert row["optimizer_steps"] == 3
    assert row["tau_tree"] is None and row["tau_tree_method"] is None and 1.0 <= row["tau_chain"] <= 3.0
