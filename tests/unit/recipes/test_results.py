"""Stage results read back from their markers as written: the same keys, older markers too."""

from __future__ import annotations

import json

from eaglewire.recipes.results import (
    DataStageResult,
    DecodeStageResult,
    EvalStageResult,
    QuickstartSummary,
    TrainStageResult,
)

CHAIN = {
    "tokens_per_s": 139.4, "tau": 2.0, "heldout_predicted_tau": 1.33, "heldout_prediction_method": "replay",
    "heldout_relative_error": 0.5, "heldout_prediction_note": "", "speedup_vs_plain": 0.56,
    "decode_tokens_per_s": 149.6, "decode_speedup_vs_plain": 0.55, "identical_to_plain": True,
    "differences_explained": None, "per_position_acceptance": [1.0, 0.0, 0.0], "served_predicted_tau": 2.0,
    "measured_tau_in_text": 2.0, "served_relative_error": 0.0,
    "served_predicted_per_position_acceptance": [1.0, 0.0, 0.0], "served_prediction_note": "",
}  # fmt: skip
PLAIN = {
    "tokens_per_s": 249.9, "tau": None, "speedup_vs_plain": 1.0, "decode_tokens_per_s": 270.1,
    "decode_speedup_vs_plain": 1.0, "identical_to_plain": None, "differences_explained": None,
    "per_position_acceptance": [],
}  # fmt: skip


def test_a_decode_marker_reads_back_to_the_same_json_key_for_key() -> None:
    marker = {"chitchat-eval": {"plain": PLAIN, "eagle-chain": CHAIN}}
    result = DecodeStageResult.from_json(json.loads(json.dumps(marker)))
    assert result.to_json() == marker
    assert list(result.to_json()["chitchat-eval"]["eagle-chain"]) == list(CHAIN)  # and in the same order
    assert result.heldout_values() == {"eagle-chain": 1.33}
    assert result.heldout_values("method") == {"eagle-chain": "replay"}
    assert result.served_tau_chain() == {"chitchat-eval": 2.0}


def test_older_markers_read_with_their_own_names_and_without_later_keys() -> None:
    old_chain = {k: v for k, v in CHAIN.items() if k != "differences_explained"} | {
        "differences_at_near_ties": True
    }
    old_chain = {k: v for k, v in old_chain.items() if not k.startswith("served_")}
    decoded = DecodeStageResult.from_json({"mt-bench": {"eagle-chain": old_chain}})
    chain = decoded.sets["mt-bench"]["eagle-chain"]
    assert chain.differences_explained is True and chain.served is None
    assert decoded.served_tau_chain() == {"mt-bench": None}
    evaluated = EvalStageResult.from_json({"summary": {"loss": 1.0}, "predicted_tau_chain": 1.5})
    assert evaluated.predicted_tau_chain_first_answers is None
    trained = TrainStageResult.from_json(
        {"draft_dir": "/d", "optimizer_steps": 3, "tokens_per_s": 1.0, "eval": None}
    )
    assert trained.tokens is None


def test_data_and_summary_keep_their_keys() -> None:
    split = {
        "conversations": 10, "tokens": 900, "loss_tokens": 400, "regenerated": True,
        "regenerate_tokens_per_s": 12.5, "truncated": 0, "capture": {"shards": 1, "bytes": 10, "tokens_per_s": 3.0},
    }  # fmt: skip
    data = {"train": split, "vocab": {"draft_vocab_size": 256}, "eval": {**split, "capture": None}}
    data["eval"].pop("capture")
    assert DataStageResult.from_json(data).to_json() == data
    stopped = {"preset": "tiny", "stage_seconds": {"target": 1.0}, "stopped_after": "target", "out_dir": "/r"}
    assert QuickstartSummary.from_json(stopped).to_json() == stopped
    done = QuickstartSummary("tiny", {"target": 1.0}, "/r", decode=DecodeStageResult({}), doctor_ok=True)
    assert QuickstartSummary.from_json(done.to_json()) == done
