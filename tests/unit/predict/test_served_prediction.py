"""The prediction on the served text (`eaglewire.predict.served`): in float32 on CPU the replay over the
text a speculative setting served equals the engine's measured rounds exactly, through `run_benchmark`.

A tiny random Llama target, a draft trained on its greedy text after the bench's prompts (the engine
tests' recipe, so rounds accept several drafts), three prompts, 35 tokens each. The comparison cuts
the engine's last round at the end of the generated text, the rule of
`tests/unit/predict/test_replay_matches_engine.py`; at 35 tokens that cut changes some prompt's last round.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.bench.harness import BenchConfig, run_benchmark
from eaglewire.bench.report import BenchReport
from eaglewire.draft.io import save_draft
from eaglewire.predict.served import (
    CHAIN_METHOD,
    TREE_METHOD,
    RoundStats,
    ServedPrediction,
    rounds_within_text,
    served_markdown,
    served_summary,
)
from tests.unit.predict.conftest import served_tiny

TRAIN_TOKENS = 40  # greedy tokens after each prompt the draft is trained on
NEW_TOKENS = 35  # max_new_tokens: a last round verifies drafts past it (checked below)
CHAIN = 4


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> BenchReport:
    tiny = served_tiny(TRAIN_TOKENS)
    target, prompts = tiny.target, tiny.prompts
    draft_dir = save_draft(tiny.draft, tiny.contract, tmp_path_factory.mktemp("served") / "draft")
    cfg = BenchConfig(max_new_tokens=NEW_TOKENS, methods=("plain", "eagle-chain", "eagle-tree"), chain_steps=CHAIN,
                      tree_num_steps=3, tree_topk=2, tree_num_draft_tokens=6, warmup=0, repeats=1)  # fmt: skip
    return run_benchmark(target, draft_dir, prompts, cfg)


def test_chain_prediction_on_served_text_equals_measured(report: BenchReport) -> None:
    chain = report.results["eagle-chain"]
    assert chain.mismatches == []  # float32: lossless, so the served text is the target's greedy text
    (row,) = [r for r in report.served_predictions if r.method == "eagle-chain"]
    assert row.measured is not None and row.predicted is not None
    assert row.prediction_method == CHAIN_METHOD and row.note == ""
    # exactly: rounds, tokens, tau and per-position acceptance
    assert row.predicted == row.measured and row.exact
    assert row.predicted_tau == row.measured_tau_in_text and row.error == 0.0 and row.relative_error == 0.0
    assert row.measured.rounds == chain.num_verifications
    assert row.measured_tau == chain.tau  # the methods table's tau, last rounds whole
    # the cut removed drafts past the text's end (some prompt's last round), and only those
    assert row.measured_tau is not None and row.measured_tau_in_text is not None
    assert row.measured_tau > row.measured_tau_in_text
    assert chain.new_tokens <= row.measured.tokens < row.measured_tau * row.measured.rounds
    # a trained draft: rounds accept deep chains, so the equality is tested on real acceptances
    assert row.measured.per_position_acceptance[1] > 0.2
    assert row.generated_tokens == chain.new_tokens and row.prompts == 3


def test_tree_prediction_on_served_text_equals_measured(report: BenchReport) -> None:
    """The dynamic tree replayed over the served text (`predict.text_replay`): the engine's own
    rounds, exactly, as the chain's replay is."""
    tree = report.results["eagle-tree"]
    assert tree.mismatches == []
    (row,) = [r for r in report.served_predictions if r.method == "eagle-tree"]
    assert row.setting == {"num_steps": 3, "topk": 2, "num_draft_tokens": 6}
    assert row.prediction_method == TREE_METHOD and row.note == ""
    assert row.predicted is not None and row.measured is not None
    assert row.predicted == row.measured and row.exact
    assert row.predicted_tau == row.measured_tau_in_text and row.error == 0.0
    assert row.measured.per_position_acceptance[1] > 0.2  # deep acceptances, not a trivial match


def test_report_fields(report: BenchReport, tmp_path: Path) -> None:
    report.write(tmp_path, plots=False)
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["method"]: r for r in data["served_predictions"]}
    assert list(rows) == ["eagle-chain", "eagle-tree"]
    chain = rows["eagle-chain"]
    assert {"measured_tau", "measured_tau_in_text", "served_predicted_tau", "error", "relative_error",
            "heldout_predicted_tau", "measured_per_position_acceptance",
            "served_predicted_per_position_acceptance", "measured_rounds", "served_predicted_rounds",
            "rounds_match", "prediction_method", "seconds", "note"} <= set(chain)  # fmt: skip
    assert chain["served_predicted_tau"] == chain["measured_tau_in_text"] and chain["rounds_match"]
    assert chain["heldout_predicted_tau"] is None  # no held-out evaluation was given
    summary = data["served_prediction_summary"]
    assert summary["settings_compared"] == 2 and summary["settings_exact"] >= 1
    prompt = data["methods"]["eagle-chain"]["prompts"][0]
    assert (
        len(prompt["accepted_per_round"]) == prompt["num_verifications"] == len(prompt["emitted_per_round"])
    )
    md = (tmp_path / "bench.md").read_text()
    assert "Prediction on the served text vs measured tau:" in md
    assert "| predicted on served text |" in md and "| eagle-chain | 4/1/5 |" in md


def test_rounds_within_text_cuts_the_last_round() -> None:
    # 10 generated tokens; rounds start at 0, 3, 6: the last accepted 4 drafts, 10 - 6 = 4 fit
    assert rounds_within_text([2, 2, 4], [3, 3, 5], 10) == [2, 2, 4]
    # 8 tokens: the last round starts at 6, only 2 of its drafts lie in the text
    assert rounds_within_text([2, 2, 4], [3, 3, 5], 8) == [2, 2, 2]
    stats = RoundStats.from_accepted([2, 2, 2], 4)
    assert (stats.rounds, stats.tokens, stats.tau) == (3, 9, 3.0)
    assert stats.per_position_acceptance == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 accepted counts but 1 emitted"):
        rounds_within_text([1, 1], [2], 5)


def test_row_errors_and_markdown() -> None:
    setting = {"num_steps": 2, "topk": 1, "num_draft_tokens": 3}
    measured, predicted = RoundStats(4, 10, [0.75, 0.5]), RoundStats(4, 8, [0.5, 0.5])
    row = ServedPrediction("eagle-chain", setting, 2.6, measured, predicted, 2.9, CHAIN_METHOD)
    assert row.error == pytest.approx(0.5) and row.relative_error == pytest.approx(0.25) and not row.exact
    failed = ServedPrediction("eagle-tree", {**setting, "topk": 2}, 2.0, measured, None, note="failed: why")
    assert failed.error is None and failed.to_json()["served_predicted_tau"] is None
    md = served_markdown([row, failed])
    assert (
        "| eagle-chain | 2/1/3 | 2.60 | 2.50 | 2.00 | +0.500 | +25.0% | 4 / 4 | 2.90 | 0.75 0.50 | 0.50 0.50 |"
        in md
    )
    assert "- (failed: why)" in md
    assert served_summary([row, failed]) == {"settings_compared": 1, "settings_exact": 0,
                                             "mean_abs_relative_error": 0.25, "max_abs_relative_error": 0.25}  # fmt: skip
    assert served_summary([]) == {"settings_compared": 0}


def test_off_by_config(tiny_target, draft_dir, two_prompts) -> None:  # type: ignore[no-untyped-def]
    cfg = BenchConfig(max_new_tokens=3, methods=("eagle-chain",), chain_steps=2, warmup=0, repeats=1,
                      served_prediction=False)  # fmt: skip
    report = run_benchmark(tiny_target, draft_dir, two_prompts, cfg)
    assert report.served_predictions == [] and report.to_json()["served_predictions"] == []
