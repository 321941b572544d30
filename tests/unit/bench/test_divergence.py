"""Where a method's greedy text parts from the reference's, the target's own logit margin says
whether rounding can explain it: a flip to the target's runner-up at a small margin is a near-tie,
a flip to a token it ranks far below is a bug; the report says which."""

from __future__ import annotations

import pytest
import torch

from eaglewire.bench.divergence import NEAR_TIE_LOGITS, add_margins, is_near_tie
from eaglewire.bench.report import markdown_table
from eaglewire.bench.results import MethodResult, PromptRun, compare_outputs, fill_comparisons

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
    assert mismatches[0].near_tie == (want <= NEAR_TIE_LOGITS["bfloat16"])
    if pick == "last":  # a tiny random model still ranks its worst token far below its best
        assert mismatches[0].near_tie is False


def test_an_ended_text_has_no_margin(tiny_target, greedy) -> None:  # type: ignore[no-untyped-def]
    reference = [run("p", greedy)]
    mismatches = compare_outputs([run("p", greedy[:PARTS_AT])], reference)
    add_margins(tiny_target, {"p": PROMPT}, reference, mismatches, dtype="float32")
    assert mismatches[0].token is None and mismatches[0].margin is None and mismatches[0].near_tie is None


def test_thresholds_follow_the_dtype() -> None:
    assert is_near_tie(0.3, "bfloat16") and not is_near_tie(0.3, "float32")
    assert is_near_tie(-1e-4, "float32") and not is_near_tie(2.0, "bfloat16")
    assert is_near_tie(None, "bfloat16") is None


def test_report_says_whether_a_difference_is_rounding_or_a_bug(tiny_target, greedy) -> None:  # type: ignore[no-untyped-def]
    logits = next_logits(tiny_target, PROMPT + greedy[:PARTS_AT])
    worst = int(logits.argmin())
    results = {
        "plain": MethodResult("plain", True, runs=[run("p", greedy)]),
        "eagle-chain": MethodResult(
            "eagle-chain", True, runs=[run("p", greedy[:PARTS_AT] + [worst] * (NEW_TOKENS - PARTS_AT))]
        ),
    }
    fill_comparisons(results, "plain")
    mismatches = results["eagle-chain"].mismatches or []
    add_margins(tiny_target, {"p": PROMPT}, results["plain"].runs, mismatches, dtype="bfloat16")
    table = markdown_table(results, "plain")
    assert "NO (1/1 prompts differ, 1 NOT at a near-tie)" in table
    mismatches[0].near_tie = True  # as a bf16 flip at a near-tie would be
    assert "NO (1/1 prompts differ, all at near-ties)" in markdown_table(results, "plain")
