"""The quickstart: reference target -> data -> train -> evaluate -> decode -> export -> doctor.

Each stage writes into its own folder of the run directory and a `<stage>.json` result; a
rerun skips finished stages (regeneration and training resume mid-stage), so an interrupted
quickstart picks up where it stopped. Held-out prompts are never trained on: training uses the
built-in sets' train splits, evaluation and decoding their eval splits (and MT-bench).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json
from eaglewire.outputs import OutputKind, claim_output_dir
from eaglewire.recipes.presets import QuickstartPreset, train_config
from eaglewire.recipes.quickstart_data import stage_data, training_data_dir
from eaglewire.recipes.quickstart_decode import heldout_tau, served_tau_chain, stage_decode
from eaglewire.recipes.resume import STAGES, check_resume, preset_json

if TYPE_CHECKING:
    from eaglewire.train.evaluate import EvalResult

log = logging.getLogger(__name__)

TARGET = "smollm2"


class _Stopped(Exception):
    """The stage `QuickstartRun.stop_after` names has finished (caught by `run_quickstart`)."""


@dataclass
class StageLog:
    name: str
    seconds: float
    result: dict[str, Any]
    skipped: bool = False


@dataclass
class QuickstartRun:
    preset: QuickstartPreset
    out_dir: Path
    target: str = TARGET
    stages: list[StageLog] = field(default_factory=list)
    on_stage: Callable[[str], None] | None = None
    on_target_report: Callable[[Any], None] | None = None  # gets the TargetReport when the target stage runs
    stop_after: str | None = None  # the last stage to run (None: all); a rerun without it resumes there

    def __post_init__(self) -> None:
        if self.stop_after is not None and self.stop_after not in STAGES:
            raise ConfigError(f"stop_after: expected one of {list(STAGES)}, got {self.stop_after!r}")
        # stage results record paths (the trained draft's, the exports'): absolute, so that a rerun
        # from another working directory resumes the same run instead of missing its files
        self.out_dir = Path(self.out_dir).resolve()

    def path(self, *parts: str) -> Path:
        return self.out_dir.joinpath(*parts)

    def stage(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run `fn` unless `<name>.json` records it as done; record its result and wall time."""
        marker = self.path(f"{name}.json")
        if self.on_stage is not None:
            self.on_stage(name)
        if marker.exists():
            done = json.loads(marker.read_text())
            self.stages.append(StageLog(name, done["seconds"], done["result"], skipped=True))
        else:
            for later in STAGES[STAGES.index(name) + 1 :]:  # they ran on what this stage now redoes
                self.path(f"{later}.json").unlink(missing_ok=True)
            start = time.perf_counter()
            result = fn()
            seconds = time.perf_counter() - start
            atomic_write_json(marker, {"stage": name, "seconds": seconds, "result": result})
            self.stages.append(StageLog(name, seconds, result))
        if name == self.stop_after:
            raise _Stopped
        return dict(self.stages[-1].result)


def stage_train(run: QuickstartRun) -> dict[str, Any]:
    from eaglewire.data.vocab import load_draft_vocab
    from eaglewire.train.run import run_training

    p = run.preset
    vocab = load_draft_vocab(run.path("data", "vocab"))
    result = run_training(
        target=run.target,
        data_dir=training_data_dir(run, "train"),
        out_dir=run.path("train"),
        config=train_config(p),
        eval_dir=training_data_dir(run, "eval"),
        resume=run.path("train").exists(),
        draft_to_target=vocab.draft_to_target,
        draft_intermediate_size=p.draft_intermediate_size or None,
        device=p.device,
        target_dtype=p.target_dtype,
    )
    return {
        "draft_dir": str(result.draft_dir),
        "optimizer_steps": result.optimizer_steps,
        "tokens": result.tokens,
        "tokens_per_s": result.tokens_per_s,
        "eval": result.eval,
    }


def evaluate_heldout(run: QuickstartRun, draft_dir: Path, loaded: Any) -> EvalResult:
    """The trainer's offline evaluation of the draft on the held-out eval data (whole responses):
    what the eval stage reports and, cut to first answers at the decode horizon (`as_benchmark`),
    what the decode stage's held-out prediction replays. Deep enough for the chain, the tree and the
    trained steps. `loaded`: the run's target (loaded once for every stage)."""
    from eaglewire.train.run import run_eval

    p = run.preset
    return run_eval(
        draft_dir=draft_dir,
        target=run.target,
        data_dir=run.path("data", "eval"),
        num_steps=max(p.chain_steps, p.ttt_steps, p.tree_num_steps),
        max_length=p.max_length,
        device=p.device,
        target_dtype=p.target_dtype,
        loaded=loaded,
    )


def at_decode_horizon(run: QuickstartRun, result: EvalResult) -> EvalResult:
    """`result` replaying only the first decode_max_new_tokens of each response, as the decode stage
    generates at most that many tokens per prompt."""
    return replace(result, horizon=run.preset.decode_max_new_tokens)


def as_benchmark(run: QuickstartRun, result: EvalResult) -> EvalResult:
    """`result` replaying what the decode stage serves: each held-out record's first answer (a
    benchmark prompt is a first user turn) up to decode_max_new_tokens. Later answers draft more
    easily (on an H200, chain of 5: first answers 2.68, second 3.78, third 4.45; 2.65 measured;
    docs/history/benchmarks-log.md §2f)."""
    from eaglewire.train.evaluate import FIRST_ANSWER

    return replace(at_decode_horizon(run, result), answer=FIRST_ANSWER)


def stage_eval(
    run: QuickstartRun, draft_dir: Path, loaded: Any, *, keep: Callable[[EvalResult], None] | None = None
) -> dict[str, Any]:
    """Evaluate the draft on the held-out data; `keep` gets the result as the decode stage serves
    (`as_benchmark`: its held-out predictor, so that a run evaluates once)."""
    p = run.preset
    result = evaluate_heldout(run, draft_dir, loaded)
    summary = result.summary()
    at_decode = at_decode_horizon(run, result)
    benchmark = as_benchmark(run, result)
    if keep is not None:
        keep(benchmark)
    return {
        "summary": summary,
        "predicted_tau_chain": at_decode.tau_chain(p.chain_steps),
        "predicted_tau_chain_first_answers": benchmark.tau_chain(p.chain_steps),
        "predicted_horizon_tokens": p.decode_max_new_tokens,
        "predicted_tau_chain_whole_responses": result.tau_chain(p.chain_steps),
    }


def stage_export(run: QuickstartRun, draft_dir: Path) -> dict[str, Any]:
    from eaglewire.export.exporting import export_draft

    p = run.preset
    out = {}
    for fmt in ("sglang", "vllm"):
        result = export_draft(
            draft_dir,
            fmt,
            run.path("export", fmt),
            num_steps=p.chain_steps,
            topk=1,
            num_draft_tokens=p.chain_steps + 1,
            force=True,  # a rerun of this stage replaces the run's own earlier export, whole
        )
        out[fmt] = {
            "dir": str(result.out),
            "layer_ids": list(result.layer_ids),
            "numbering": result.numbering,
            "launch_command": result.launch_command,
        }
    return out


def stage_doctor(run: QuickstartRun) -> dict[str, Any]:
    from eaglewire.doctor.run import DoctorOptions, run_doctor

    out = {}
    for fmt in ("sglang", "vllm"):
        report = run_doctor(
            DoctorOptions(
                draft=run.path("export", fmt), target=run.target, target_dtype=run.preset.target_dtype
            )
        )
        out[fmt] = {
            "ok": not report.findings,
            "findings": [f.what for f in report.findings],
            "verdict": [list(r) for r in report.verdict_rows()],
        }
    return out


def run_quickstart(run: QuickstartRun) -> dict[str, Any]:
    """Every stage in order (up to `run.stop_after`); returns the summary, also written to
    summary.json when every stage ran. Stopped early (e.g. after 'data', which prepares what
    `benchmarks/draft_levers.py` trains on), the summary names the stage and has no results."""
    try:
        return _run_stages(run)
    except _Stopped:
        return {
            "preset": run.preset.name,
            "stage_seconds": {s.name: s.seconds for s in run.stages},
            "stopped_after": run.stop_after,
            "out_dir": str(run.out_dir),
        }


def _run_stages(run: QuickstartRun) -> dict[str, Any]:
    from eaglewire.recipes.inspect_target import inspect_target
    from eaglewire.target.loading import load_target

    # missing, empty, or a quickstart run (its marker, or preset.json from before markers): before any work
    claim_output_dir(run.out_dir, OutputKind.QUICKSTART_RUN)
    if run.path("preset.json").exists():  # a rerun: only stages its changes do not feed are reused
        check_resume(run.out_dir, json.loads(run.path("preset.json").read_text()), run.preset)
    atomic_write_json(run.path("preset.json"), preset_json(run.preset))
    loaded = load_target(run.target, dtype=run.preset.target_dtype, device=run.preset.device)

    def target_stage() -> dict[str, Any]:
        report = inspect_target(loaded)
        if run.on_target_report is not None:
            run.on_target_report(report)
        return {
            "contract": report.contract.to_json(),
            "engine_ids": report.engine_ids,
            "norms": [[n.key.boundary, n.key.norm, n.mean_token_norm] for n in report.norms],
        }

    run.stage("target", target_stage)
    run.stage("data", lambda: stage_data(run, loaded))
    trained = run.stage("train", lambda: stage_train(run))
    draft_dir = Path(trained["draft_dir"])
    kept: list[EvalResult] = []  # the eval stage's `as_benchmark` result, if it runs in this process
    evaluated = run.stage("eval", lambda: stage_eval(run, draft_dir, loaded, keep=kept.append))
    decoded = run.stage(
        "decode", lambda: stage_decode(run, loaded, draft_dir, heldout=next(iter(kept), None))
    )
    run.stage("export", lambda: stage_export(run, draft_dir))
    doctored = run.stage("doctor", lambda: stage_doctor(run))
    summary = {
        "preset": run.preset.name,
        "stage_seconds": {s.name: s.seconds for s in run.stages},
        "predicted_tau_chain": evaluated.get("predicted_tau_chain"),  # held-out records
        "predicted_tau_chain_first_answers": evaluated.get("predicted_tau_chain_first_answers"),
        "heldout_predicted_tau": heldout_tau(decoded),  # per speculative method, at the decode horizon
        "heldout_prediction_method": heldout_tau(decoded, "heldout_prediction_method"),
        "served_predicted_tau_chain": served_tau_chain(decoded),  # per prompt set, on the text it served
        "decode": decoded,
        "doctor_ok": all(v["ok"] for v in doctored.values()),
        "out_dir": str(run.out_dir),
    }
    atomic_write_json(run.path("summary.json"), summary)
    return summary
