"""The quickstart's decode stage: plain vs EAGLE-3 chain and tree on held-out prompt sets (and the
transformers baselines where the preset asks), each speculative setting's held-out and served-text
predictions beside its measured tau, and the summary's per-set taus."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglewire.recipes.presets import DecodePlan
from eaglewire.recipes.quickstart_eval import as_benchmark, evaluate_heldout
from eaglewire.recipes.quickstart_run import QuickstartRun
from eaglewire.recipes.results import (
    DecodeMethodResult,
    DecodeStageResult,
    HeldoutPrediction,
    ServedPrediction,
)

if TYPE_CHECKING:
    from eaglewire.bench.results import Mismatch
    from eaglewire.predict.evaluation import EvalResult
    from eaglewire.predict.predictor import PredictionRow

log = logging.getLogger(__name__)


def stage_decode(
    run: QuickstartRun, loaded: Any, draft_dir: Path, *, heldout: EvalResult | None = None
) -> DecodeStageResult:
    """Benchmark plain vs EAGLE-3 chain and tree (and HF baselines on GPU) on held-out prompts, with
    the held-out prediction of each speculative setting beside its measured tau (chains by the
    evaluation's replay, trees decoded by the engine's drafter over the held-out first answers:
    `predict.heldout_trees`). `heldout`: the eval stage's result as the decode stage serves
    (`as_benchmark`) when that stage ran in this process; None evaluates here (a resumed run whose
    eval stage finished earlier)."""
    from eaglewire.bench.baselines import HF_METHODS
    from eaglewire.bench.engine_adapter import load_engine
    from eaglewire.bench.harness import BenchConfig, Workload, run_benchmark
    from eaglewire.bench.prompts import load_prompt_set
    from eaglewire.predict.heldout_trees import heldout_tree_predictor

    p = run.preset.decode
    out: dict[str, dict[str, DecodeMethodResult]] = {}
    if heldout is None:
        log.info("held-out prediction: evaluating the draft on the held-out data (eval stage ran earlier)")
        heldout = as_benchmark(run, evaluate_heldout(run, draft_dir, loaded))
    # the records the evaluation ran on (evaluate_heldout: all of them), the same target
    predictor = heldout_tree_predictor(heldout, loaded, draft_dir, run.path("data", "eval"))
    runs = decode_runs(p)
    prompt_sets = {r.name: load_prompt_set(r.prompt_set, r.num_prompts) for r in runs}
    # one engine for every prompt set: each decoder compiles and captures its graphs once
    nodes = max(p.tree_num_draft_tokens, p.chain_steps + 1)
    room = max(
        Workload.build(loaded, prompts, max_new_tokens=p.max_new_tokens, chat=True).max_seq_len(nodes)
        for prompts in prompt_sets.values()
    )
    engine = load_engine(loaded, draft_dir, max_seq_len=room)
    for bench_run in runs:
        name, prompts = bench_run.name, prompt_sets[bench_run.name]
        hf = HF_METHODS if bench_run.with_baselines else ()
        cfg = BenchConfig(
            max_new_tokens=p.max_new_tokens,
            methods=("plain", "eagle-chain", "eagle-tree", *hf),
            chain_steps=p.chain_steps,
            tree_num_steps=p.tree_num_steps,
            tree_topk=p.tree_topk,
            tree_num_draft_tokens=p.tree_num_draft_tokens,
            warmup=1,
            repeats=p.timing_repeats,
        )
        report = run_benchmark(loaded, draft_dir, prompts, cfg, engine=engine, predictor=predictor)
        report.write(run.path("decode", name))
        served = {row.method: row for row in report.served_predictions}
        out[name] = {
            m: DecodeMethodResult(
                tokens_per_s=r.tokens_per_s,
                tau=r.tau,
                speedup_vs_plain=r.speedup_vs_plain,
                decode_tokens_per_s=r.decode_tokens_per_s,
                decode_speedup_vs_plain=r.decode_speedup_vs_plain,
                identical_to_plain=None if r.mismatches is None else not r.mismatches,
                differences_explained=_explained(r.mismatches),
                per_position_acceptance=r.per_position_acceptance,
                heldout=_heldout(r.settings, report.predictions),
                served=_served(served.get(m)),
            )
            for m, r in report.results.items()
            if r.available
        }
    return DecodeStageResult(out)


WHOLE_SUFFIX = "-all"  # a prompt set decoded whole (DecodePlan.whole_sets)


@dataclass(frozen=True)
class DecodeRun:
    """One bench run of the decode stage."""

    name: str  # where its results go: decode/<name>, and its key in the decode stage's result
    prompt_set: str
    num_prompts: int | None  # the first this many prompts; None = all
    with_baselines: bool  # also time the transformers baselines (~27 ms a token on an H200)


def decode_runs(plan: DecodePlan) -> list[DecodeRun]:
    """Every prompt set's first `prompts` (a set in whole_sets: every prompt instead, as
    '<set>-all'), then the sets that also time the transformers baselines (their first
    hf_baseline_prompts, under the set's own name): those take minutes on a GPU, so a run cut short
    by its time budget has lost only them. User-like sets (mt-bench, user-eval) go first: the headline."""
    from eaglewire.bench.prompts import USER_LIKE, prompt_set_kind

    firsts = [
        DecodeRun(name, name, plan.prompts, False)
        for name in plan.prompt_sets
        if name not in plan.whole_sets and name not in plan.hf_baseline_sets
    ]
    wholes = [DecodeRun(name + WHOLE_SUFFIX, name, None, False) for name in plan.whole_sets]
    baselines = [
        DecodeRun(name, name, plan.hf_baseline_prompts or plan.prompts, True)
        for name in plan.prompt_sets
        if name in plan.hf_baseline_sets
    ]
    ours = sorted(firsts + wholes, key=lambda r: prompt_set_kind(r.prompt_set) != USER_LIKE)  # stable
    return ours + baselines


def prompt_set_kinds(plan: DecodePlan) -> dict[str, str]:
    """Each decode run's label in the summary: user-like (the headline) or in-distribution held-out."""
    from eaglewire.bench.prompts import prompt_set_kind

    return {r.name: prompt_set_kind(r.prompt_set) for r in decode_runs(plan)}


def _explained(mismatches: list[Mismatch] | None) -> bool | None:
    """True when every measured greedy difference is rounding or the reference's drift from the
    target's forward (`eaglewire.bench.divergence.cause_of`), False when one is this method's (a
    bug), None when there are none (or none was measured)."""
    from eaglewire.bench.divergence import THIS_METHOD  # torch-heavy, like the stages' imports

    causes = [m.cause for m in mismatches or [] if m.cause is not None]
    return THIS_METHOD not in causes if causes else None


def _heldout(settings: dict[str, Any], rows: list[PredictionRow]) -> HeldoutPrediction | None:
    """A speculative method's held-out prediction (`eaglewire.predict.predictor`): its row of `rows`
    is the one for its setting; other methods have none."""
    row = next((r for r in rows if r.setting == settings), None)
    if row is None:
        return None
    return HeldoutPrediction(row.predicted_tau, row.prediction_method, row.relative_error, row.note)


def _served(row: Any) -> ServedPrediction | None:
    """A speculative method's prediction on the text it served (`eaglewire.predict.served`), if made."""
    if row is None:
        return None
    return ServedPrediction(
        predicted_tau=row.predicted_tau,
        measured_tau_in_text=row.measured_tau_in_text,
        relative_error=row.relative_error,
        predicted_per_position_acceptance=[]
        if row.predicted is None
        else row.predicted.per_position_acceptance,
        note=row.note,
    )
