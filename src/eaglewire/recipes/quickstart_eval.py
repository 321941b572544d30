"""The quickstart's eval stage: the trainer's offline evaluation of the draft on the held-out data,
and the chain's tau it predicts at the decode stage's horizon (what the decode stage also replays)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglewire.recipes.quickstart_run import QuickstartRun
from eaglewire.recipes.results import EvalStageResult

if TYPE_CHECKING:
    from eaglewire.predict.evaluation import EvalResult


def evaluate_heldout(run: QuickstartRun, draft_dir: Path, loaded: Any) -> EvalResult:
    """The trainer's offline evaluation of the draft on the held-out eval data (whole responses):
    what the eval stage reports and, cut to first answers at the decode horizon (`as_benchmark`),
    what the decode stage's held-out prediction replays. Deep enough for the chain, the tree and the
    trained steps. `loaded`: the run's target (loaded once for every stage)."""
    from eaglewire.predict.evaluation import run_eval

    p = run.preset
    return run_eval(
        draft_dir=draft_dir,
        target=run.target,
        data_dir=run.path("data", "eval"),
        num_steps=max(p.decode.chain_steps, p.train.ttt_steps, p.decode.tree_num_steps),
        max_length=p.train.max_length,
        device=p.device,
        target_dtype=p.target_dtype,
        loaded=loaded,
    )


def at_decode_horizon(run: QuickstartRun, result: EvalResult) -> EvalResult:
    """`result` replaying only the first decode.max_new_tokens of each response, as the decode stage
    generates at most that many tokens per prompt."""
    return replace(result, horizon=run.preset.decode.max_new_tokens)


def as_benchmark(run: QuickstartRun, result: EvalResult) -> EvalResult:
    """`result` replaying what the decode stage serves: each held-out record's first answer (a
    benchmark prompt is a first user turn) up to decode.max_new_tokens. Later answers draft more
    easily (chain of 5: first answers 2.68, third 4.45; log §2f)."""
    from eaglewire.predict.evaluation import FIRST_ANSWER

    return replace(at_decode_horizon(run, result), answer=FIRST_ANSWER)


def stage_eval(
    run: QuickstartRun, draft_dir: Path, loaded: Any, *, keep: Callable[[EvalResult], None] | None = None
) -> EvalStageResult:
    """Evaluate the draft on the held-out data; `keep` gets the result as the decode stage serves
    (`as_benchmark`: its held-out predictor, so that a run evaluates once)."""
    chain = run.preset.decode.chain_steps
    result = evaluate_heldout(run, draft_dir, loaded)
    benchmark = as_benchmark(run, result)
    if keep is not None:
        keep(benchmark)
    return EvalStageResult(
        summary=result.summary(),
        predicted_tau_chain=at_decode_horizon(run, result).tau_chain(chain),
        predicted_tau_chain_first_answers=benchmark.tau_chain(chain),
        predicted_horizon_tokens=run.preset.decode.max_new_tokens,
        predicted_tau_chain_whole_responses=result.tau_chain(chain),
    )
