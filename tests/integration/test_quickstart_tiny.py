"""The whole quickstart pipeline on a tiny random target: data -> train -> eval -> decode -> export -> doctor."""

import json
from pathlib import Path

import pytest
import torch

import eaglewire.predict.evaluation as evaluation
from eaglewire.cli.quickstart import show_summary
from eaglewire.recipes.presets import get_preset
from eaglewire.recipes.quickstart import QuickstartRun, run_quickstart
from tests.helpers.tiny import make_tiny_target, save_tiny_target


def _assert_heldout_predictions(run_dir, decode, predicted_tau_chain):
    """The decode stage's bench report and results carry the held-out (eval data) prediction of the
    chain and the tree as the decode stage serves (first answers, at the decode horizon): the eval
    stage's first-answer chain prediction."""
    bench = json.loads((run_dir / "decode" / "chitchat-eval" / "bench.json").read_text())
    rows = {(r["topk"], r["num_draft_tokens"]): r for r in bench["predictions"]}
    chain, tree = rows[(1, 4)], rows[(2, 4)]  # the tiny preset: a chain of 3, a tree of 4 nodes, topk 2
    assert chain["predicted_tau"] == pytest.approx(predicted_tau_chain, rel=1e-6)
    assert tree["predicted_tau"] >= 1.0 and not tree["note"], tree
    # chains by the evaluation's replay; the tree decoded by the engine's drafter over the answers
    assert (chain["prediction_method"], tree["prediction_method"]) == ("replay", "dynamic_tree_replay")
    assert decode["eagle-tree"]["heldout_prediction_method"] == "dynamic_tree_replay"
    served = {r["method"]: r for r in bench["served_predictions"]}
    assert served["eagle-chain"]["heldout_predicted_tau"] == chain["predicted_tau"]
    assert served["eagle-tree"]["heldout_predicted_tau"] == tree["predicted_tau"]
    assert decode["eagle-chain"]["heldout_predicted_tau"] == chain["predicted_tau"]
    assert decode["eagle-tree"]["heldout_predicted_tau"] == tree["predicted_tau"]
    assert "heldout_predicted_tau" not in decode["plain"]


def test_quickstart_pipeline_on_tiny_target(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEWIRE_HOME", str(tmp_path / "home"))
    evaluations = []
    real_run_eval = evaluation.run_eval

    def counted_run_eval(**kwargs):
        evaluations.append(kwargs["data_dir"])
        return real_run_eval(**kwargs)

    monkeypatch.setattr(evaluation, "run_eval", counted_run_eval)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target_dir = save_tiny_target(make_tiny_target("llama"), tmp_path / "target")
        stages = []
        monkeypatch.chdir(tmp_path)  # a relative run directory, as the CLI's default `runs/quickstart`
        run = QuickstartRun(
            preset=get_preset("tiny"),
            out_dir=Path("run"),
            target=str(target_dir),
            on_stage=stages.append,
        )
        result = run_quickstart(run)
        summary = result.to_json()  # what summary.json holds
    finally:
        torch.set_num_threads(threads)
    assert stages == ["target", "data", "train", "eval", "decode", "export", "doctor"]
    # train_from_shards (the cpu preset's path): both splits captured once, complete, trained from
    data = json.loads((tmp_path / "run" / "data.json").read_text())["result"]
    for split in ("train", "eval"):
        manifest = json.loads((tmp_path / "run" / "data" / f"{split}_shards" / "manifest.json").read_text())
        assert manifest["complete"] and manifest["num_tokens"] == data[split]["tokens"]
        assert data[split]["capture"]["shards"] == len(manifest["shards"])
    decode = summary["decode"]["chitchat-eval"]
    assert summary["prompt_set_kind"] == {"chitchat-eval": "in-distribution held-out"}  # labelled as such
    assert {"plain", "eagle-chain", "eagle-tree"} <= set(decode)
    for method in ("eagle-chain", "eagle-tree"):  # float32: speculative greedy text == plain greedy text
        assert decode[method]["identical_to_plain"] is True
        assert decode[method]["tau"] >= 1.0
        assert decode[method]["served_predicted_tau"] >= 1.0  # the replay over the text it served
    # float32: on the served text the replay reproduces the chain's rounds exactly (cut at the text's end)
    chain = decode["eagle-chain"]
    assert (
        chain["served_predicted_tau"] == chain["measured_tau_in_text"]
        and chain["served_relative_error"] == 0.0
    )
    assert summary["served_predicted_tau_chain"]["chitchat-eval"] == chain["served_predicted_tau"]
    # the decode stage reuses the eval stage's held-out evaluation: one evaluation in the run
    assert len(evaluations) == 1 and evaluations[0] == (tmp_path / "run" / "data" / "eval").resolve()
    # the first answers' replay, what a benchmark prompt's answer is, from the same evaluation
    first = summary["predicted_tau_chain_first_answers"]
    assert isinstance(first, float) and first >= 1.0
    _assert_heldout_predictions(tmp_path / "run", decode, first)
    assert summary["heldout_predicted_tau"] == {
        m: decode[m]["heldout_predicted_tau"] for m in ("eagle-chain", "eagle-tree")
    }
    show_summary(result)  # the CLI's tables, served column and row included
    assert summary["doctor_ok"], json.loads((tmp_path / "run" / "doctor.json").read_text())
    sglang = json.loads((tmp_path / "run" / "export" / "sglang" / "config.json").read_text())
    assert sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        1,
        3,
        4,
    ]  # boundaries 2, 4, 5 of 8 layers
    # A rerun skips every finished stage.
    again = QuickstartRun(preset=get_preset("tiny"), out_dir=tmp_path / "run", target=str(target_dir))
    run_quickstart(again)
    assert all(s.skipped for s in again.stages)
    # From another working directory, a stage that reruns finds what the finished ones recorded.
    (tmp_path / "run" / "decode.json").unlink()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    resumed = QuickstartRun(preset=get_preset("tiny"), out_dir=Path("../run"), target=str(target_dir))
    resumed_summary = run_quickstart(resumed).to_json()
    # the stages after it ran on what it redoes, so they run again too
    assert [s.name for s in resumed.stages if not s.skipped] == ["decode", "export", "doctor"]
    # the eval stage finished in an earlier run: the resumed decode stage evaluates the held-out data itself
    assert len(evaluations) == 2
    _assert_heldout_predictions(
        tmp_path / "run",
        resumed_summary["decode"]["chitchat-eval"],
        summary["predicted_tau_chain_first_answers"],
    )


def test_stop_after_data_then_a_rerun_goes_on_from_there(tmp_path, monkeypatch):
    """--stop-after data leaves the data stage's datasets (what benchmarks/draft_levers.py trains
    on) and no later stage; the rerun without it reuses the data and runs the rest."""
    from eaglewire.errors import ConfigError

    monkeypatch.setenv("EAGLEWIRE_HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError, match="stop_after: expected one of"):
        QuickstartRun(preset=get_preset("tiny"), out_dir=tmp_path / "run", stop_after="trian")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target_dir = save_tiny_target(make_tiny_target("llama"), tmp_path / "target")
        first = QuickstartRun(preset=get_preset("tiny"), out_dir=tmp_path / "run", target=str(target_dir),
                              stop_after="data")  # fmt: skip
        stopped = run_quickstart(first).to_json()
        assert stopped["stopped_after"] == "data" and set(stopped["stage_seconds"]) == {"target", "data"}
        run_dir = tmp_path / "run"
        assert (run_dir / "data.json").exists() and not (run_dir / "train.json").exists()
        assert not (run_dir / "summary.json").exists()
        for part in ("train", "eval", "vocab"):
            assert (run_dir / "data" / part).is_dir(), part
        again = QuickstartRun(preset=get_preset("tiny"), out_dir=run_dir, target=str(target_dir))
        summary = run_quickstart(again).to_json()
    finally:
        torch.set_num_threads(threads)
    assert [s.name for s in again.stages if s.skipped] == ["target", "data"]
    assert "stopped_after" not in summary and (run_dir / "summary.json").exists()
