"""`eaglewire train` / `eaglewire eval` on real on-disk data (a saved tiny target, shards, a tokenized set)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import ShardDataset, ShardWriter
from eaglewire.data.types import ShardContent
from eaglewire.errors import ConfigError, ContractMismatchError
from eaglewire.target.identity import build_contract, tokenizer_hash
from eaglewire.target.loading import load_target
from eaglewire.train.batches import record_lengths
from tests.helpers.tiny import save_tiny_target
from tests.unit.train.conftest import capture_records

COMMON = [
    "--epochs",
    "3",
    "--ttt-steps",
    "2",
    "--batch-size",
    "4",
    "--max-length",
    "64",
    "--no-progress",
    "--json",
]


@pytest.fixture(scope="module")
def disk(tiny_target, token_records, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    save_tiny_target(tiny_target, root / "target")
    target = load_target(root / "target", dtype="float32")
    contract = build_contract(target)
    meta = {"split": "train", "tokenizer_hash": tokenizer_hash(target.tokenizer)}
    TokenizedDataset.from_records(token_records, meta=meta).save(root / "tokens")
    writer = ShardWriter(root / "shards", contract, plan={"test": 1}, total_records=len(token_records))
    writer.write(0, 0, ShardContent.from_records(capture_records(target, contract, token_records)))
    writer.finish()
    return root


def run(args):
    result = CliRunner().invoke(app, args, catch_exceptions=True)
    return result


def test_train_offline_then_eval(disk, tmp_path):
    res = run(
        [
            "train",
            "--target",
            str(disk / "target"),
            "--data",
            str(disk / "shards"),
            "--out",
            str(tmp_path / "run"),
            "--max-steps",
            "3",
            "--checkpoint-every",
            "2",
            "--no-compile",
            *COMMON,
        ]
    )
    assert res.exit_code == 0, (res.output, res.exception)
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["optimizer_steps"] == 3 and len(report["train"]["acc"]) == 2
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["compile"] is False
    assert (tmp_path / "run" / "draft" / "model.safetensors").exists()
    assert json.loads((tmp_path / "run" / "latest.json").read_text())["optimizer_step"] == 3
    # resuming a finished run reads its stored config and does no further step
    res = run(
        [
            "train",
            "--target",
            str(disk / "target"),
            "--data",
            str(disk / "shards"),
            "--out",
            str(tmp_path / "run"),
            "--resume",
            "--no-progress",
            "--json",
        ]
    )
    assert res.exit_code == 0, (res.output, res.exception)
    assert json.loads(res.stdout[res.stdout.index("{") :])["optimizer_steps"] == 3

    args = [
        "eval",
        "--draft",
        str(tmp_path / "run" / "draft"),
        "--target",
        str(disk / "target"),
        "--data",
        str(disk / "shards"),
        "--num-steps",
        "2",
        "--tree",
        "2x2",
        "--json",
        "--max-records",
        "6",
    ]
    res = run(args)
    assert res.exit_code == 0, (res.output, res.exception)
    ev = json.loads(res.stdout[res.stdout.index("{") :])
    assert ev["records"] == 6 and len(ev["acc"]) == 2
    assert set(ev["tau_pred_chain"]) == {"1", "2"}
    assert 1.0 <= ev["tau_pred_chain"]["1"] <= ev["tau_pred_chain"]["2"] <= ev["tau_pred_tree"] <= 3.0
    assert ev["horizon"] is None
    # the replay by answer: these records hold one answer each, so all of it is the first answer's
    assert list(ev["predicted_tau_chain_by_turn"]) == ["1"]
    assert ev["predicted_tau_chain_by_turn"]["1"][1] == pytest.approx(ev["tau_pred_chain"]["2"])
    # labels outside the draft vocabulary: their share per step, and the chain's bound were they drafted right
    assert len(ev["out_of_vocab_share"]) == 2 and all(0.0 <= x <= 1.0 for x in ev["out_of_vocab_share"])
    assert ev["tau_pred_chain_full_vocab"] >= ev["tau_pred_chain"]["2"]
    text = run([a for a in args if a != "--json"])
    assert text.exit_code == 0 and "by answer" not in text.output, (text.output, text.exception)
    assert "the most a larger --draft-vocab-size can add" in " ".join(text.output.split())
    # --horizon replays only the first N tokens of each response (a decoder's max_new_tokens)
    short = run([*args, "--horizon", "3"])
    assert short.exit_code == 0, (short.output, short.exception)
    ev3 = json.loads(short.stdout[short.stdout.index("{") :])
    assert ev3["horizon"] == 3 and ev3["acc"] == ev["acc"]  # the accuracies do not depend on it
    assert ev3["replay_rounds"] < ev["replay_rounds"]
    bad = run([*args, "--horizon", "-1"])
    # a ConfigError now (exit 2 with its message through the console script), not a usage error
    assert bad.exit_code != 0 and "--horizon" in str(bad.exception)


def test_train_online_from_a_tokenized_dataset(disk, tmp_path):
    res = run(
        [
            "train",
            "--target",
            str(disk / "target"),
            "--data",
            str(disk / "tokens"),
            "--out",
            str(tmp_path / "run"),
            "--max-steps",
            "2",
            *COMMON,
        ]
    )
    assert res.exit_code == 0, (res.output, res.exception)
    assert json.loads(res.stdout[res.stdout.index("{") :])["optimizer_steps"] == 2
    res = run(
        [
            "eval",
            "--draft",
            str(tmp_path / "run" / "draft"),
            "--target",
            str(disk / "target"),
            "--data",
            str(disk / "tokens"),
            "--num-steps",
            "2",
            "--max-records",
            "3",
            "--json",
        ]
    )
    assert res.exit_code == 0, (res.output, res.exception)
    assert json.loads(res.stdout[res.stdout.index("{") :])["records"] == 3


def test_shard_lengths_are_read_from_offsets(disk, token_records):
    assert record_lengths(ShardDataset(disk / "shards")) == [len(r.input_ids) for r in token_records]


def test_draft_for_another_wiring_is_refused(disk, tmp_path):
    res = run(
        [
            "draft",
            "init",
            "--target",
            str(disk / "target"),
            "--out",
            str(tmp_path / "d"),
            "--aux-boundaries",
            "1,4,5",
        ]
    )
    assert res.exit_code == 0, (res.output, res.exception)
    res = run(
        [
            "train",
            "--target",
            str(disk / "target"),
            "--data",
            str(disk / "shards"),
            "--out",
            str(tmp_path / "run"),
            "--draft-init",
            str(tmp_path / "d"),
            "--max-steps",
            "1",
            *COMMON,
        ]
    )
    assert isinstance(res.exception, ContractMismatchError)
    assert "aux_boundaries: draft=[1, 4, 5] data=[2, 4, 5]" in str(res.exception)
    assert not (tmp_path / "run").exists()


def test_a_wider_draft_trains_and_a_clashing_width_is_refused(disk, tmp_path):
    """--draft-intermediate-size widens a fresh draft's MLP; asking another width of a --draft-init
    draft names both widths before anything is trained."""
    base = ["train", "--target", str(disk / "target"), "--data", str(disk / "tokens"), "--max-steps", "1"]
    res = run([*base, "--out", str(tmp_path / "wide"), "--draft-intermediate-size", "96", *COMMON])
    assert res.exit_code == 0, (res.output, res.exception)
    cfg = json.loads((tmp_path / "wide" / "draft" / "config.json").read_text())
    assert cfg["intermediate_size"] == 96
    res = run(
        [
            *base,
            "--out",
            str(tmp_path / "again"),
            "--draft-init",
            str(tmp_path / "wide" / "draft"),
            "--draft-intermediate-size",
            "64",
            *COMMON,
        ]
    )
    assert isinstance(res.exception, ConfigError), (res.output, res.exception)
    assert "draft intermediate_size 64 asked" in str(res.exception) and "has 96" in str(res.exception)
    assert not (tmp_path / "again").exists()
    init = ["draft", "init", "--target", str(disk / "target"), "--out", str(tmp_path / "d")]
    res = run([*init, "--draft-intermediate-size", "80"])
    assert res.exit_code == 0, (res.output, res.exception)
    assert json.loads((tmp_path / "d" / "config.json").read_text())["intermediate_size"] == 80


def test_more_draft_attention_heads_train_and_a_clashing_count_is_refused(disk, tmp_path):
    """run_training(draft_num_attention_heads=...) gives a fresh draft that many query heads; asking
    another count of a --draft-init draft names both before anything is trained."""
    from eaglewire.train.config import TrainConfig
    from eaglewire.train.run import run_training

    config = TrainConfig(ttt_steps=2, batch_size=4, max_length=64, max_steps=1)
    common = dict(target=str(disk / "target"), data_dir=disk / "tokens", config=config, progress=False)
    trained = run_training(out_dir=tmp_path / "heads", draft_num_attention_heads=8, **common)
    cfg = json.loads((trained.draft_dir / "config.json").read_text())
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (8, 4)  # the tiny target: 4 / 2
    with pytest.raises(ConfigError, match="draft num_attention_heads 4 asked, but the --draft-init .* has 8"):
        run_training(
            out_dir=tmp_path / "again", draft_init=trained.draft_dir, draft_num_attention_heads=4, **common
        )
    assert not (tmp_path / "again").exists()


def test_source_repeats_weigh_shard_records_by_their_ids(disk, tmp_path):
    """--source-repeats reads the shards' record ids (make_records' ids have no ':', so each id is its
    own source): the named records fill more rows, so the same epochs take more optimizer steps; a
    name no record carries is refused, listing the sources there are."""
    common = ["train", "--target", str(disk / "target"), "--data", str(disk / "shards")]
    steps = {}
    for name, extra in (("plain", []), ("weighted", ["--source-repeats", "rec-1-0:9,rec-1-1:9"])):
        res = run([*common, "--out", str(tmp_path / name), *extra, *COMMON])
        assert res.exit_code == 0, (res.output, res.exception)
        steps[name] = json.loads(res.stdout[res.stdout.index("{") :])["optimizer_steps"]
    assert steps["weighted"] > steps["plain"]
    saved = json.loads((tmp_path / "weighted" / "train_config.json").read_text())
    assert saved["source_repeats"] == ["rec-1-0:9", "rec-1-1:9"]
    res = run([*common, "--out", str(tmp_path / "typo"), "--source-repeats", "chitchat:2", *COMMON])
    assert isinstance(res.exception, ConfigError), (res.output, res.exception)
    assert "names ['chitchat']" in str(res.exception) and "rec-1-0" in str(res.exception)
    assert not (tmp_path / "typo").exists()  # refused before anything was written
