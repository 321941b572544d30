"""Prediction check math on hand-made numbers (no engine, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import DataFormatError
from eaglewire.predict.predictor import (
    PredictionRow,
    SummaryPredictor,
    find_summary_predictor,
    load_summary_predictor,
    predict_tau,
    prediction_markdown,
    prediction_rows,
    prediction_summary,
    tree_for_spec,
)
from eaglewire.predict.replay import predicted_tau_tree


class RanksPredictor:
    """The trainer's position-averaged tree estimator over hand-made ranks, as both the prediction and
    the position-averaged value (what EvalResult.position_averaged_tau_tree does)."""

    prediction_method = "position_averaged"

    def __init__(self, ranks: list[list[int]]) -> None:
        self.ranks = torch.tensor(ranks)
        self.valid = torch.ones_like(self.ranks, dtype=torch.bool)

    def tau_chain(self, k: int) -> float:
        return predicted_tau_tree(self.ranks, self.valid, [(0,) * d for d in range(1, k + 1)])

    def tau_tree(self, tree) -> float:  # type: ignore[no-untyped-def]
        return predicted_tau_tree(self.ranks, self.valid, tree)

    position_averaged_tau_chain = tau_chain
    position_averaged_tau_tree = tau_tree


def test_chain_prediction_from_cond_acc() -> None:
    p = SummaryPredictor((0.8, 0.5, 0.25))
    assert predict_tau(p, SpecArgs.chain(1)) == pytest.approx(1.8)
    assert predict_tau(p, SpecArgs.chain(2)) == pytest.approx(1 + 0.8 + 0.4)
    assert predict_tau(p, SpecArgs.chain(3)) == pytest.approx(1 + 0.8 + 0.4 + 0.1)


def test_rows_error_and_summary() -> None:
    p = SummaryPredictor((0.8, 0.5))
    rows = prediction_rows(p, [(SpecArgs.chain(1), 2.0), (SpecArgs.chain(2), 1.8), (SpecArgs(2, 2, 3), 1.5)])
    assert rows[0].predicted_tau == pytest.approx(1.8) and rows[0].error == pytest.approx(0.2)
    assert rows[0].relative_error == pytest.approx(0.2 / 1.8)
    assert rows[1].error == pytest.approx(1.8 - 2.2)
    assert rows[2].predicted_tau is None and "per-step accuracies only" in rows[2].note  # a tree needs ranks
    s = prediction_summary(rows)
    assert s["settings_compared"] == 2
    assert s["mean_error"] == pytest.approx((0.2 - 0.4) / 2)
    assert s["mean_abs_error"] == pytest.approx(0.3) and s["max_abs_error"] == pytest.approx(0.4)
    assert s["mean_abs_relative_error"] == pytest.approx((0.2 / 1.8 + 0.4 / 2.2) / 2)
    md = prediction_markdown(rows)
    assert "| 1 | 1 | 2 | 1.80 | 2.00 | +0.20 | +11.1% | 1.80 |" in md
    assert rows[0].prediction_method == "position_averaged"  # a summary without replay numbers
    assert rows[0].to_json()["position_averaged_tau"] == pytest.approx(1.8)
    assert prediction_summary([PredictionRow({}, None, 2.0)]) == {"settings_compared": 0}


def test_a_chain_deeper_than_the_summary_names_the_fix() -> None:
    # train_summary.json of a draft trained on 2 unrolled steps; the bench drafts a chain of 3
    shallow = SummaryPredictor((0.8, 0.5), "run/train_summary.json", replay_tau_chain=(1.8, 2.1))
    for p in (shallow, SummaryPredictor((0.8, 0.5), "run/train_summary.json")):
        (row,) = prediction_rows(p, [(SpecArgs.chain(3), 2.4)])
        assert row.predicted_tau is None and row.measured_tau == 2.4
        assert row.note.startswith("chain length k=3: run/train_summary.json evaluated 2 draft steps; fix: ")
        assert "--eval-data" in row.note and "eaglewire eval --num-steps 3 --json" in row.note
    assert predict_tau(shallow, SpecArgs.chain(2)) == pytest.approx(2.1)
    (none,) = prediction_rows(None, [(SpecArgs.chain(3), 2.4)])  # nothing found: the same two flags
    assert none.predicted_tau is None and "--eval-data" in none.note and "--eval-report" in none.note


def test_tree_for_spec_picks_the_likeliest_nodes() -> None:
    # 10 positions x 2 depths of target ranks in the draft's list: 6x rank 0, 3x rank 1, 1x rank 2 at depth 1.
    ranks = [[0, 0]] * 4 + [[0, 1]] * 2 + [[1, 0]] * 3 + [[2, 0]]
    p = RanksPredictor(ranks)
    # P((0,)) = .6, P((1,)) = .3, P((0,0)) = .4, P((0,1)) = .2, P((1,0)) = .3, P((1,1)) = 0
    tree = tree_for_spec(p, SpecArgs(num_steps=2, topk=2, num_draft_tokens=4))
    assert tree == [(0,), (1,), (0, 0)]  # ties at .3: the shallower first
    assert predict_tau(p, SpecArgs(num_steps=2, topk=2, num_draft_tokens=4)) == pytest.approx(
        1 + 0.6 + 0.3 + 0.4
    )
    assert predict_tau(p, SpecArgs(num_steps=2, topk=2, num_draft_tokens=6)) == pytest.approx(
        1 + 0.6 + 0.3 + 0.4 + 0.3 + 0.2
    )
    assert predict_tau(p, SpecArgs.chain(2)) == pytest.approx(1 + 0.6 + 0.4)


def test_summary_predictor_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "draft").mkdir(parents=True)
    (run / "train_summary.json").write_text(
        json.dumps({"eval": {"cond_acc": [0.5, None], "acc": [0.5, 0.2]}})
    )
    p = find_summary_predictor(run / "draft")
    assert (
        p is not None and p.cond_acc[0] == 0.5 and p.tau_chain(2) == pytest.approx(1.5)
    )  # NaN step counts as 0
    assert find_summary_predictor(tmp_path) is None
    # a summary from an evaluation that kept per-position ranks carries the replayed chain taus
    (run / "train_summary.json").write_text(
        json.dumps({"eval": {"cond_acc": [0.5, 0.5], "predicted_tau_chain": [1.4, 1.45]}})
    )
    p = find_summary_predictor(run / "draft")
    assert p is not None and p.prediction_method == "replay"
    assert p.tau_chain(2) == pytest.approx(1.45) and p.position_averaged_tau_chain(2) == pytest.approx(1.75)
    row = prediction_rows(p, [(SpecArgs.chain(2), 1.5)])[0]
    assert row.predicted_tau == pytest.approx(1.45) and row.position_averaged_tau == pytest.approx(1.75)
    assert row.prediction_method == "replay" and row.error == pytest.approx(0.05)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"acc": [0.5]}))
    with pytest.raises(DataFormatError, match="no 'cond_acc'"):
        load_summary_predictor(bad)


def test_real_evaluation_predicts_chains_and_trees(tiny_target, draft_dir) -> None:  # type: ignore[no-untyped-def]
    """The trainer's EvalResult plugs in as a predictor: chain replay and static-tree approximation."""
    from eaglewire.data.types import TokenizedRecord
    from eaglewire.draft.io import load_draft
    from eaglewire.predict.evaluation import evaluate_draft
    from eaglewire.train.target_side import OnlineTarget

    draft, contract = load_draft(draft_dir)
    gen = torch.Generator().manual_seed(0)
    records = []
    for i in range(3):
        ids = torch.randint(3, tiny_target.vocab_size, (20,), generator=gen)
        mask = torch.ones(20, dtype=torch.bool)
        mask[:4] = False
        records.append(TokenizedRecord(record_id=f"r{i}", input_ids=ids, loss_mask=mask))
    side = OnlineTarget(tiny_target, contract, draft.draft_to_target)
    result = evaluate_draft(draft, contract, side, records, num_steps=3)
    chain, tree = SpecArgs.chain(3), SpecArgs(num_steps=3, topk=2, num_draft_tokens=5)
    rows = prediction_rows(result, [(chain, 1.25), (tree, 1.5)])
    assert rows[0].predicted_tau == pytest.approx(result.tau_chain(3))
    assert rows[0].position_averaged_tau == pytest.approx(result.position_averaged_tau_chain(3))
    # a bare EvalResult has no texts to decode the dynamic tree over: the static tree, and it says so
    assert [r.prediction_method for r in rows] == ["replay", "static_tree_replay"]
    nodes = tree_for_spec(result, tree)
    assert len(nodes) == 4 and all(len(n) == 1 or n[:-1] in nodes for n in nodes)
    assert rows[1].predicted_tau == pytest.approx(result.tau_tree(nodes))
    assert rows[1].position_averaged_tau == pytest.approx(result.position_averaged_tau_tree(nodes))
    assert all(r.predicted_tau is not None and r.predicted_tau >= 1.0 for r in rows)
    assert rows[1].error == pytest.approx(1.5 - rows[1].predicted_tau)
