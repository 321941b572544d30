"""Aggregation, speedups and greedy comparison on hand-made numbers."""

from __future__ import annotations

import pytest

from eaglewire.bench.report import BenchReport, markdown_table
from eaglewire.bench.results import (
    MethodResult,
    PromptRun,
    compare_outputs,
    fill_comparisons,
    first_difference,
)


def run(pid: str, tokens: list[int], seconds: float, **kw) -> PromptRun:  # type: ignore[no-untyped-def]
    return PromptRun(pid, prompt_tokens=5, token_ids=tokens, seconds=seconds, all_seconds=[seconds], **kw)


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_aggregates_weight_by_verifications() -> None:
    phases = {"prefill": 0.1, "draft": 0.2, "verify": 0.5, "accept": 0.1}
    a = run(
        "a",
        [1] * 30,
        1.0,
        tau=3.0,
        num_verifications=10,
        per_position_acceptance=[0.9, 0.6],
        phase_seconds=phases,
    )
    b = run(
        "b",
        [1] * 10,
        1.0,
        tau=1.0,
        num_verifications=10,
        per_position_acceptance=[0.1, 0.0],
        phase_seconds=phases,
    )
    m = MethodResult("eagle-chain", available=True, runs=[a, b])
    assert m.tokens_per_s == pytest.approx(40 / 2.0)
    assert m.tau == pytest.approx((3.0 * 10 + 1.0 * 10) / 20)
    assert m.per_position_acceptance == pytest.approx([0.5, 0.3])
    assert a.host_seconds() == pytest.approx(1.0 - 0.9)
    ph = m.phase_seconds
    assert ph["verify"] == pytest.approx(1.0) and ph["host"] == pytest.approx(0.2)
    frac = m.cycle_fraction  # draft 0.4, verify 1.0, accept 0.2, host 0.2 over 1.8
    assert frac == pytest.approx(
        {"draft": 0.4 / 1.8, "verify": 1.0 / 1.8, "accept": 0.2 / 1.8, "host": 0.2 / 1.8}
    )
    assert sum(frac.values()) == pytest.approx(1.0)


def test_speedups_and_mismatches() -> None:
    plain = MethodResult("plain", True, runs=[run("a", [1, 2, 3, 4], 2.0), run("b", [5, 6], 2.0)])
    spec = MethodResult("eagle-tree", True, runs=[run("a", [1, 2, 3, 4], 0.5), run("b", [5, 7], 0.5)])
    hf = MethodResult("hf-generate", True, runs=[run("a", [1, 2, 3, 4], 20.0), run("b", [5, 6], 40.0)])
    off = MethodResult("hf-static-compiled", False, reason="needs CUDA")
    results = {"plain": plain, "eagle-tree": spec, "hf-generate": hf, "hf-static-compiled": off}
    fill_comparisons(results, "plain")
    assert spec.speedup_vs_plain == pytest.approx(6.0 / 6.0 * 4.0)  # 6 tok / 1 s vs 6 tok / 4 s
    assert spec.speedup_vs_hf_generate == pytest.approx(6.0 / (6.0 / 60.0))
    assert hf.speedup_vs_plain == pytest.approx((6 / 60) / (6 / 4))
    assert plain.mismatches is None and off.mismatches is None
    assert hf.mismatches == []
    assert spec.mismatches is not None and len(spec.mismatches) == 1
    mm = spec.mismatches[0]
    assert (mm.prompt_id, mm.position, mm.token, mm.reference_token) == ("b", 1, 7, 6)
    assert compare_outputs(plain.runs, plain.runs) == []
    table = markdown_table(results, "plain")
    assert "| eagle-tree |" in table and "NO (1/2 prompts differ)" in table
    assert "not available: needs CUDA" in table
    report = BenchReport(meta={"prompts": "x"}, results=results, reference="plain")
    assert report.mismatch_count() == 1
    data = report.to_json()
    assert set(data["methods"]) == set(results)
    assert data["methods"]["eagle-tree"]["greedy_mismatches"][0]["position"] == 1
    assert "differs from `plain` on b at generated token 1" in report.markdown()


def test_decode_only_figures_leave_out_the_prefill() -> None:
    plain = MethodResult(
        "plain",
        True,
        runs=[
            run("a", [1] * 11, 1.2, phase_seconds={"prefill": 0.2, "decode": 1.0}),
            run("b", [1] * 21, 2.3, phase_seconds={"prefill": 0.3, "decode": 2.0}),
        ],
    )
    spec = MethodResult(
        "eagle-chain",
        True,
        runs=[
            run("a", [1] * 11, 0.5, num_verifications=4, tau=2.75, phase_seconds={"prefill": 0.2}),
            run("b", [1] * 21, 0.8, num_verifications=6, tau=3.5, phase_seconds={"prefill": 0.3}),
        ],
    )
    hf = MethodResult("hf-generate", True, runs=[run("a", [1] * 11, 4.0), run("b", [1] * 21, 6.0)])
    results = {"plain": plain, "eagle-chain": spec, "hf-generate": hf}
    fill_comparisons(results, "plain")
    assert plain.decode_seconds == pytest.approx(3.0)
    assert plain.decode_tokens_per_s == pytest.approx(32 / 3.0)
    assert plain.decode_ms_per_forward == pytest.approx(3000 / 30)  # 32 tokens, 2 from the prefills
    assert spec.decode_ms_per_forward == pytest.approx(800 / 10)  # per verification round
    assert spec.decode_speedup_vs_plain == pytest.approx((32 / 0.8) / (32 / 3.0))
    assert hf.decode_tokens_per_s is None and hf.decode_speedup_vs_plain is None


def test_tau_by_category_pools_each_category_and_the_report_shows_it() -> None:
    """tau per prompt category weights each prompt by its verifications, as the overall tau; the
    Markdown report has a category table only when the prompts fall into two or more categories."""
    from eaglewire.bench.report import category_markdown

    plain = MethodResult("plain", True, runs=[run(p, [1] * 8, 1.0, category=c) for p, c in (("a", "math"), ("b", "math"), ("c", "writing"))])  # fmt: skip
    chain = MethodResult(
        "eagle-chain",
        True,
        runs=[
            run("a", [1] * 30, 1.0, tau=3.0, num_verifications=10, category="math"),
            run("b", [1] * 30, 1.0, tau=1.0, num_verifications=30, category="math"),
            run("c", [1] * 20, 1.0, tau=2.0, num_verifications=10, category="writing"),
        ],
    )
    assert chain.tau_by_category == pytest.approx({"math": 1.5, "writing": 2.0})  # 60 tokens / 40 rounds
    assert plain.tau_by_category == {}  # no speculation, no tau
    assert chain.to_json()["tau_by_category"] == chain.tau_by_category
    table = category_markdown({"plain": plain, "eagle-chain": chain})
    assert table.splitlines()[0] == "| category | prompts | eagle-chain |"
    assert "| math | 2 | 1.50 |" in table and "| writing | 1 | 2.00 |" in table
    one = MethodResult("eagle-chain", True, runs=[run("a", [1] * 4, 1.0, tau=2.0, num_verifications=2, category="math")])  # fmt: skip
    assert category_markdown({"eagle-chain": one}) == ""
    report = BenchReport(
        meta={"prompts": "mt-bench"}, results={"plain": plain, "eagle-chain": chain}, reference="plain"
    )
    assert "tau by prompt category:" in report.markdown()


def test_a_method_result_survives_its_json() -> None:
    """What a sweep saves of a finished setting (`sweep_progress`) reads back to the same numbers."""
    import json

    a = run("a", [1, 2, 3, 4], 0.5, tau=2.0, num_verifications=2, per_position_acceptance=[1.0, 0.5],
            phase_seconds={"draft": 0.1, "verify": 0.3}, accepted_per_round=[1, 1], emitted_per_round=[2, 2],
            text="hi", finish_reason="max_new_tokens", category="writing")  # fmt: skip
    b = run("b", [5, 6], 0.25)
    original = MethodResult("eagle-tree", available=True, settings={"num_steps": 2}, runs=[a, b])
    back = MethodResult.from_json(json.loads(json.dumps(original.to_json())))
    assert back.to_json() == original.to_json()
    assert back.runs == original.runs
