"""Where a method's greedy text parts from the reference's, the target's own logit margin says
what explains it: a flip to the target's runner-up at a small margin is a near-tie (rounding), a
flip to a token it ranks far below is a bug in the method, and a method that keeps the target's
argmax where the reference took a token ranked far below shows the reference's drift, not a bug;
the report and the quickstart's summary say which."""

from __future__ import annotations

import pytest
import torch

from eaglewire.bench.divergence import (
    NEAR_TIE_LOGITS,
    REFERENCE,
    ROUNDING,
    THIS_METHOD,
    add_margins,
    cause_of,
)
from eaglewire.bench.report import _margin_note, _ties_note, markdown_table
from eaglewire.bench.results import MethodResult, Mismatch, PromptRun, compare_outputs, fill_comparisons
from eaglewire.cli.quickstart import _same
from eaglewire.recipes.quickstart_decode import _explained

PROMPT = [5, 17, 42, 7, 99, 3]
NEW_TOKENS = 6
PARTS_AT = 3  # the generated token where the other method parts


def run(prompt_id: str, tokens: list[int]) -> PromptRun:
    return PromptRun(prompt_id, len(PROMPT), tokens, seconds=1.0, all_seconds=[1.0])


@torch.no_grad()
def next_logits(target, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return target.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()  # [V]


@pytest.fixture(scope="module")
def greedy(tiny_target) -> list[int]:  # type: ignore[no-untyped-def]
    out: list[int] = []
    for _ in range(NEW_TOKENS):
        out.append(int(next_logits(tiny_target, PROMPT + out).argmax()))
    return out


@pytest.mark.parametrize("pick", ["runner-up", "last"])
def test_margin_is_the_targets_preference_at_the_first_difference(tiny_target, greedy, pick) -> None:  # type: ignore[no-untyped-def]
    logits = next_logits(tiny_target, PROMPT + greedy[:PARTS_AT])
    ranked = logits.argsort(descending=True)
    other = int(ranked[1] if pick == "runner-up" else ranked[-1])
    parted = greedy[:PARTS_AT] + [other] + greedy[PARTS_AT + 1 :]
    reference = [run("p", greedy)]
    mismatches = compare_outputs([run("p", parted)], reference)
    assert [(m.position, m.token, m.reference_token) for m in mismatches] == [
        (PARTS_AT, other, greedy[PARTS_AT])
    ]
    add_margins(tiny_target, {"p": PROMPT}, reference, mismatches, dtype="bfloat16")
    want = float(logits[greedy[PARTS_AT]] - logits[other])
    assert mismatches[0].margin == pytest.approx(want, abs=1e-5) and want > 0
    assert mismatches[0].cause == (ROUNDING if want <= NEAR_TIE_LOGITS["bfloat16"] else THIS_METHOD)
    if pick == "last":  # a tiny random model still ranks its worst token far below its best
        assert mismatches[0].cause == THIS_METHOD


def test_an_ended_text_has_no_margin(tiny_target, greedy) -> None:  # type: ignore[no-untyped-def]
    reference = [run("p", greedy)]
    mismatches = compare_outputs([run("p", greedy[:PARTS_AT])], reference)
    add_margins(tiny_target, {"p": PROMPT}, reference, mismatches, dtype="float32")
    assert mismatches[0].token is None and mismatches[0].margin is None and mismatches[0].cause is None


def test_a_reference_that_left_the_targets_argmax_is_its_drift(tiny_target, greedy) -> None:  # type: ignore[no-untyped-def]
    # the reference took a token the target ranks last; the method kept the target's argmax
    logits = next_logits(tiny_target, PROMPT + greedy[:PARTS_AT])
    worst = int(logits.argmin())
    drifted = greedy[:PARTS_AT] + [worst] + greedy[PARTS_AT + 1 :]
    reference = [run("p", drifted)]
    mismatches = compare_outputs([run("p", greedy)], reference)
    add_margins(tiny_target, {"p": PROMPT}, reference, mismatches, dtype="bfloat16")
    want = float(logits[worst] - logits[greedy[PARTS_AT]])
    assert mismatches[0].margin == pytest.approx(want, abs=1e-5)
    assert want < -NEAR_TIE_LOGITS["bfloat16"] and mismatches[0].cause == REFERENCE
    assert mismatches[0].to_json()["cause"] == "the reference"


@pytest.mark.parametrize(
    ("dtype", "tie", "clear"), [("bfloat16", 0.5, 0.75), ("float16", 0.25, 0.3), ("float32", 1e-3, 0.01)]
)
def test_thresholds_follow_the_dtype(dtype: str, tie: float, clear: float) -> None:
    assert NEAR_TIE_LOGITS[dtype] == tie
    assert cause_of(0.0, dtype) == cause_of(tie, dtype) == cause_of(-tie, dtype) == ROUNDING
    assert cause_of(clear, dtype) == THIS_METHOD
    assert cause_of(-clear, dtype) == REFERENCE  # the H200 run's -0.750 in bf16
    assert cause_of(None, dtype) is None
    # an unknown dtype is held to float32's threshold
    assert cause_of(0.3, "int8") == cause_of(0.3, "float32") == THIS_METHOD


def _report(tiny_target, method_tokens, reference_tokens) -> tuple[dict[str, MethodResult], list[Mismatch]]:  # type: ignore[no-untyped-def]
    """Results for one prompt of `eagle-chain` against `plain`, margins measured in bf16."""
    results = {
        "plain": MethodResult("plain", True, runs=[run("p", reference_tokens)]),
        "eagle-chain": MethodResult("eagle-chain", True, runs=[run("p", method_tokens)]),
    }
    fill_comparisons(results, "plain")
    mismatches = results["eagle-chain"].mismatches or []
    add_margins(tiny_target, {"p": PROMPT}, results["plain"].runs, mismatches, dtype="bfloat16")
    return results, mismatches


def test_report_says_whether_a_difference_is_rounding_or_a_bug(tiny_target, greedy) -> None:  # type: ignore[no-untyped-def]
    logits = next_logits(tiny_target, PROMPT + greedy[:PARTS_AT])
    worst = int(logits.argmin())
    results, mismatches = _report(tiny_target, greedy[:PARTS_AT] + [worst] * (NEW_TOKENS - PARTS_AT), greedy)
    table = markdown_table(results, "plain")
    assert "NO (1/1 prompts differ, 1 NOT at a near-tie (a bug))" in table
    assert _margin_note(mismatches[0]).endswith(": NOT a near-tie: a bug in this method)")
    assert _explained(mismatches) is False and _same(False, _explained(mismatches)) == "NO"
    mismatches[0].cause = ROUNDING  # as a bf16 flip at a near-tie would be
    table = markdown_table(results, "plain")
    assert "NO (1/1 prompts differ, all at near-ties)" in table
    assert _explained(mismatches) is True and _same(False, _explained(mismatches)) == "ties"


def test_report_does_not_blame_a_method_for_the_references_drift(tiny_target, greedy) -> None:  # type: ignore[no-untyped-def]
    logits = next_logits(tiny_target, PROMPT + greedy[:PARTS_AT])
    worst = int(logits.argmin())
    drifted = greedy[:PARTS_AT] + [worst] + greedy[PARTS_AT + 1 :]
    results, mismatches = _report(tiny_target, greedy, drifted)
    table = markdown_table(results, "plain")
    assert mismatches[0].cause == REFERENCE
    assert "NO (1/1 prompts differ, 1 where the reference parts from the target's forward)" in table
    assert "NOT a near-tie" not in table and "bug" not in table
    note = _margin_note(mismatches[0])  # bench.md's line on this difference
    assert "prefers this method's token" in note and "not a bug in this method" in note
    # the quickstart's summary: explained, its "same" column "ties", not "NO"
    assert _explained(mismatches) is True and _same(False, _explained(mismatches)) == "ties"


def test_greedy_column_counts_each_cause() -> None:
    def mm(cause):  # type: ignore[no-untyped-def]
        return Mismatch("p", 0, 1, 2, margin=0.0, cause=cause)

    mixed = [mm(THIS_METHOD), mm(REFERENCE), mm(ROUNDING), mm(ROUNDING)]
    assert _ties_note(mixed) == (
        ", 1 NOT at a near-tie (a bug), 1 where the reference parts from the target's forward, "
        "the rest at near-ties"
    )
    assert _explained(mixed) is False
    assert _ties_note([mm(REFERENCE), mm(None)]) == (
        ", 1 where the reference parts from the target's forward"
    )
    assert _ties_note([mm(ROUNDING), mm(None)]) == ", measured ones at near-ties"
    assert _ties_note([mm(None)]) == "" and _explained([mm(None)]) is None and _explained(None) is None
