"""The whole quickstart pipeline on a tiny random target: data -> train -> eval -> decode -> export -> doctor."""

import json
from pathlib import Path

import torch

from eaglewire.cli.quickstart import show_summary
from eaglewire.recipes.presets import get_preset
from eaglewire.recipes.quickstart import QuickstartRun, run_quickstart
from tests.helpers.tiny import make_tiny_target, save_tiny_target


def test_quickstart_pipeline_on_tiny_target(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEWIRE_HOME", str(tmp_path / "home"))
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
        summary = run_quickstart(run)
    finally:
        torch.set_num_threads(threads)
    assert stages == ["target", "data", "train", "eval", "decode", "export", "doctor"]
    decode = summary["decode"]["chitchat-eval"]
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
    show_summary(summary)  # the CLI's tables, served column and row included
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
    run_quickstart(resumed)
    assert [s.name for s in resumed.stages if not s.skipped] == ["decode"]
