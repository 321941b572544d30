"""The sweep grid's validity rules, and a tiny sweep writing best_setting.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.bench.sweep import (
    BEST_SETTING_FILE,
    SweepConfig,
    run_sweep,
    sweep_markdown,
    sweep_settings,
    write_best_setting,
    write_sweep,
)
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.predict.predictor import SummaryPredictor


def test_grid_keeps_only_valid_combinations() -> None:
    valid, skipped = sweep_settings(num_steps=[1, 2, 3], topk=[1, 2], num_draft_tokens=[3, 8, 3])
    got = [(s.num_steps, s.topk, s.num_draft_tokens) for s in valid]
    # chains once per num_steps (num_draft_tokens = num_steps + 1, whatever the grid says)
    assert got == [(1, 1, 2), (1, 2, 3), (2, 1, 3), (2, 2, 3), (3, 1, 4), (3, 2, 8)]
    reasons = {
        (s.setting["num_steps"], s.setting["topk"], s.setting["num_draft_tokens"]): s.reason for s in skipped
    }
    assert set(reasons) == {(1, 2, 8), (2, 2, 8), (3, 2, 3)}
    assert "scores only" in reasons[(1, 2, 8)]  # SGLang would fail at torch.topk: 7 > 2 + 0 * 4
    assert "never verified" in reasons[(3, 2, 3)]  # depth 3 drafted, only 2 tokens kept
    with pytest.raises(ConfigError, match="positive integers"):
        SweepConfig(topk=())


def test_tiny_sweep_writes_best_setting(tiny_target, draft_dir, two_prompts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = SweepConfig(num_steps=(1, 2), topk=(1, 2), num_draft_tokens=(3,), batch_sizes=(1, 2),
                      max_new_tokens=6, warmup=0, repeats=1)  # fmt: skip
    result = run_sweep(tiny_target, draft_dir, two_prompts, cfg, predictor=SummaryPredictor((0.5, 0.2)),
                       source="test sweep")  # fmt: skip
    spec_rows = [r for r in result.rows if "topk" in r.setting]
    assert {(r.setting["num_steps"], r.setting["topk"], r.setting["num_draft_tokens"]) for r in spec_rows} == {
        (1, 1, 2), (1, 2, 3), (2, 1, 3), (2, 2, 3)
    }  # fmt: skip
    assert all(r.greedy_matches_plain for r in spec_rows)  # lossless at every setting
    assert all(r.tau is not None and r.tau >= 1.0 for r in spec_rows)
    fastest = max(spec_rows, key=lambda r: r.tokens_per_s or 0.0)
    assert result.best_per_batch[1] is fastest
    assert result.best_per_batch[2].setting == {"method": "plain", "batch_size": 2}

    # a copy of the draft dir, so the shared fixture stays without best_setting.json
    draft_copy = tmp_path / "draft"
    draft_copy.mkdir()
    for f in Path(draft_dir).iterdir():
        (draft_copy / f.name).write_bytes(f.read_bytes())
    path = write_best_setting(result, draft_copy)
    assert path == draft_copy / BEST_SETTING_FILE
    best = json.loads(path.read_text())
    assert set(best) == {
        "num_steps",
        "topk",
        "num_draft_tokens",
        "batch_size",
        "tokens_per_s",
        "tau",
        "source",
    }
    assert best["batch_size"] == 1 and best["source"] == "test sweep"
    assert (best["num_steps"], best["topk"], best["num_draft_tokens"]) == tuple(
        fastest.setting[k] for k in ("num_steps", "topk", "num_draft_tokens")
    )
    assert best["tokens_per_s"] == fastest.tokens_per_s and best["tau"] == fastest.tau
    SpecArgs(num_steps=best["num_steps"], topk=best["topk"], num_draft_tokens=best["num_draft_tokens"])

    # every setting also predicted on the text it served: chains exactly (float32: no numerics)
    served = {(r.setting["num_steps"], r.setting["topk"]): r for r in result.served}
    assert set(served) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    for (_steps, topk), row in served.items():
        assert row.predicted_tau is not None, row.note
        if topk == 1:
            assert row.exact and row.predicted_tau == pytest.approx(row.measured_tau_in_text)
    assert served[(2, 1)].heldout_predicted_tau == pytest.approx(1.6)  # the held-out row, beside it
    data = result.to_json()
    assert len(data["served_predictions"]) == 4 and data["served_prediction_summary"]
    assert "Prediction on the served text" in sweep_markdown(result)

    preds = {(p.setting["num_steps"], p.setting["topk"]): p for p in result.predictions}
    assert preds[(2, 1)].predicted_tau == pytest.approx(1.6) and preds[(2, 1)].error is not None
    assert preds[(2, 2)].predicted_tau is None  # trees need ranks; the note says so

    out = tmp_path / "out"
    written = {p.name for p in write_sweep(result, out)}
    assert written == {"sweep.json", "sweep.md", "sweep.png", "prediction.png"}
    data = json.loads((out / "sweep.json").read_text())
    assert data["best_setting"] == best and data["prediction_summary"]["settings_compared"] == 2
    md = (out / "sweep.md").read_text()
    assert "Fastest per batch size" in md and "- batch 2: method=plain" in md


def test_a_cut_sweep_keeps_its_settings_and_a_rerun_measures_only_the_rest(  # type: ignore[no-untyped-def]
    tiny_target, draft_dir, two_prompts, tmp_path: Path, monkeypatch
) -> None:
    """A sweep stopped inside its third setting (as a time limit stops it) left the first two and
    plain in sweep.partial.json; the rerun reuses them as they were and measures the third."""
    import eaglewire.bench.sweep as sweep_module
    from eaglewire.bench.sweep_progress import PARTIAL_FILE

    cfg = SweepConfig(num_steps=(1, 2), topk=(1,), num_draft_tokens=(3,), max_new_tokens=6, warmup=0,
                      repeats=1, served_prediction=False)  # fmt: skip
    real = sweep_module.speculative_fn

    def cut_at_two_steps(engine, spec):  # type: ignore[no-untyped-def]
        if spec.num_steps == 2:
            raise KeyboardInterrupt("the time limit")
        return real(engine, spec)

    monkeypatch.setattr(sweep_module, "speculative_fn", cut_at_two_steps)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(tiny_target, draft_dir, two_prompts, cfg, progress_dir=tmp_path)
    saved = json.loads((tmp_path / PARTIAL_FILE).read_text())
    assert list(saved["results"]) == ["plain", "steps1-topk1-nodes2"]
    first_seconds = [r["seconds"] for r in saved["results"]["steps1-topk1-nodes2"]["prompts"]]

    monkeypatch.setattr(sweep_module, "speculative_fn", real)
    result = run_sweep(tiny_target, draft_dir, two_prompts, cfg, progress_dir=tmp_path)
    assert result.meta["resumed_settings"] == ["plain", "steps1-topk1-nodes2"]
    rows = {r.setting.get("num_steps", 0): r for r in result.rows if "topk" in r.setting}
    assert set(rows) == {1, 2} and all(r.greedy_matches_plain for r in rows.values())
    again = json.loads((tmp_path / PARTIAL_FILE).read_text())
    assert [r["seconds"] for r in again["results"]["steps1-topk1-nodes2"]["prompts"]] == first_seconds
    write_sweep(result, tmp_path, plots=False)
    assert (tmp_path / "sweep.json").exists() and not (tmp_path / PARTIAL_FILE).exists()


def test_a_rerun_of_a_different_sweep_names_what_differs(  # type: ignore[no-untyped-def]
    tiny_target, draft_dir, two_prompts, tmp_path: Path
) -> None:
    from eaglewire.bench.sweep_progress import PARTIAL_FILE

    cfg = SweepConfig(num_steps=(1,), topk=(1,), num_draft_tokens=(3,), max_new_tokens=6, warmup=0,
                      repeats=1, served_prediction=False)  # fmt: skip
    run_sweep(tiny_target, draft_dir, two_prompts, cfg, progress_dir=tmp_path)
    longer = SweepConfig(num_steps=(1,), topk=(1,), num_draft_tokens=(3,), max_new_tokens=7, warmup=0,
                         repeats=1, served_prediction=False)  # fmt: skip
    with pytest.raises(ConfigError, match=r"max_new_tokens: saved=6 now=7") as err:
        run_sweep(tiny_target, draft_dir, two_prompts, longer, progress_dir=tmp_path)
    assert "--no-sweep-resume" in str(err.value.fix)
    assert (tmp_path / PARTIAL_FILE).exists()  # nothing already measured is lost
    fresh = run_sweep(tiny_target, draft_dir, two_prompts, longer, progress_dir=tmp_path, resume=False)
    assert fresh.meta["resumed_settings"] == []


def test_the_default_grid_holds_the_presets_settings_and_the_cli_uses_it():
    """`eaglewire bench --sweep` with no grid flags sweeps SweepConfig's defaults, and they include the
    GPU preset's chain and tree (a default sweep can find what the quickstart serves)."""
    import inspect

    from eaglewire.cli.bench import bench
    from eaglewire.recipes.presets import PRESETS

    cfg = SweepConfig()
    valid, _ = sweep_settings(cfg.num_steps, cfg.topk, cfg.num_draft_tokens)
    gpu = PRESETS["gpu"]
    assert SpecArgs.chain(gpu.decode.chain_steps) in valid
    assert (
        SpecArgs(gpu.decode.tree_num_steps, gpu.decode.tree_topk, gpu.decode.tree_num_draft_tokens) in valid
    )
    params = inspect.signature(bench).parameters
    for name, values in (("sweep_num_steps", cfg.num_steps), ("sweep_topk", cfg.topk),
                         ("sweep_num_draft_tokens", cfg.num_draft_tokens)):  # fmt: skip
        assert params[name].default.default == ",".join(map(str, values)), name
