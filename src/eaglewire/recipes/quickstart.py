"""The quickstart: reference target -> data -> train -> evaluate -> decode -> export -> doctor.

Each stage writes into its own folder of the run directory and a `<stage>.json` result; a
rerun skips finished stages (regeneration and training resume mid-stage), so an interrupted
quickstart picks up where it stopped. Held-out prompts are never trained on: training uses the
built-in sets' train splits, evaluation and decoding their eval splits (and MT-bench).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from eaglewire.io_utils import atomic_write_json
from eaglewire.output_marker import OutputKind
from eaglewire.outputs import claim_output_dir
from eaglewire.recipes.quickstart_data import stage_data, training_data_dir
from eaglewire.recipes.quickstart_decode import prompt_set_kinds, stage_decode
from eaglewire.recipes.quickstart_eval import stage_eval
from eaglewire.recipes.quickstart_run import TARGET, QuickstartRun, StageLog, Stopped
from eaglewire.recipes.results import (
    DataStageResult,
    DecodeStageResult,
    DoctorFormatResult,
    DoctorStageResult,
    EvalStageResult,
    ExportFormatResult,
    ExportStageResult,
    QuickstartSummary,
    TargetStageResult,
    TrainStageResult,
)
from eaglewire.recipes.resume import check_resume, preset_json

if TYPE_CHECKING:
    from eaglewire.predict.evaluation import EvalResult

__all__ = ["TARGET", "QuickstartRun", "StageLog", "run_quickstart"]

log = logging.getLogger(__name__)


def stage_train(run: QuickstartRun) -> TrainStageResult:
    from eaglewire.data.vocab import load_draft_vocab
    from eaglewire.train.run import run_training

    p = run.preset
    vocab = load_draft_vocab(run.path("data", "vocab"))
    result = run_training(
        target=run.target,
        data_dir=training_data_dir(run, "train"),
        out_dir=run.path("train"),
        config=p.train,
        eval_dir=training_data_dir(run, "eval"),
        resume=run.path("train").exists(),
        draft_to_target=vocab.draft_to_target,
        draft_intermediate_size=p.draft_intermediate_size or None,
        device=p.device,
        target_dtype=p.target_dtype,
    )
    return TrainStageResult(
        draft_dir=str(result.draft_dir),
        optimizer_steps=result.optimizer_steps,
        tokens=result.tokens,
        tokens_per_s=result.tokens_per_s,
        eval=result.eval,
    )


def stage_export(run: QuickstartRun, draft_dir: Path) -> ExportStageResult:
    from eaglewire.export.exporting import export_draft

    chain = run.preset.decode.chain_steps
    out = {}
    for fmt in ("sglang", "vllm"):
        result = export_draft(
            draft_dir,
            fmt,
            run.path("export", fmt),
            num_steps=chain,
            topk=1,
            num_draft_tokens=chain + 1,
            force=True,  # a rerun of this stage replaces the run's own earlier export, whole
        )
        out[fmt] = ExportFormatResult(
            dir=str(result.out),
            layer_ids=list(result.layer_ids),
            numbering=result.numbering,
            launch_command=result.launch_command,
        )
    return ExportStageResult(out)


def stage_doctor(run: QuickstartRun) -> DoctorStageResult:
    from eaglewire.doctor.run import DoctorOptions, run_doctor

    out = {}
    for fmt in ("sglang", "vllm"):
        report = run_doctor(
            DoctorOptions(
                draft=run.path("export", fmt), target=run.target, target_dtype=run.preset.target_dtype
            )
        )
        out[fmt] = DoctorFormatResult(
            ok=not report.findings,
            findings=[f.what for f in report.findings],
            verdict=[list(r) for r in report.verdict_rows()],
        )
    return DoctorStageResult(out)


def run_quickstart(run: QuickstartRun) -> QuickstartSummary:
    """Every stage in order (up to `run.stop_after`); returns the summary, also written to
    summary.json when every stage ran. Stopped early (e.g. after 'data', which prepares what
    `benchmarks/draft_levers.py` trains on), the summary names the stage and has no results."""
    try:
        return _run_stages(run)
    except Stopped:
        return QuickstartSummary(
            preset=run.preset.name,
            stage_seconds={s.name: s.seconds for s in run.stages},
            out_dir=str(run.out_dir),
            stopped_after=run.stop_after,
        )


def _run_stages(run: QuickstartRun) -> QuickstartSummary:
    from eaglewire.recipes.inspect_target import inspect_target
    from eaglewire.target.loading import load_target

    # missing, empty, or a quickstart run (its marker, or preset.json from before markers): before any work
    claim_output_dir(run.out_dir, OutputKind.QUICKSTART_RUN)
    if run.path("preset.json").exists():  # a rerun: only stages its changes do not feed are reused
        check_resume(run.out_dir, json.loads(run.path("preset.json").read_text()), run.preset)
    atomic_write_json(run.path("preset.json"), preset_json(run.preset))
    loaded = load_target(run.target, dtype=run.preset.target_dtype, device=run.preset.device)

    def target_stage() -> TargetStageResult:
        report = inspect_target(loaded)
        if run.on_target_report is not None:
            run.on_target_report(report)
        return TargetStageResult(
            contract=report.contract.to_json(),
            engine_ids=dict(report.engine_ids),
            norms=[(n.key.boundary, n.key.norm, n.mean_token_norm) for n in report.norms],
        )

    run.stage("target", TargetStageResult, target_stage)
    run.stage("data", DataStageResult, lambda: stage_data(run, loaded))
    draft_dir = Path(run.stage("train", TrainStageResult, lambda: stage_train(run)).draft_dir)
    kept: list[EvalResult] = []  # the eval stage's `as_benchmark` result, if it runs in this process
    evaluated = run.stage(
        "eval", EvalStageResult, lambda: stage_eval(run, draft_dir, loaded, keep=kept.append)
    )
    decoded = run.stage(
        "decode",
        DecodeStageResult,
        lambda: stage_decode(run, loaded, draft_dir, heldout=next(iter(kept), None)),
    )
    run.stage("export", ExportStageResult, lambda: stage_export(run, draft_dir))
    doctored = run.stage("doctor", DoctorStageResult, lambda: stage_doctor(run))
    summary = QuickstartSummary(
        preset=run.preset.name,
        stage_seconds={s.name: s.seconds for s in run.stages},
        out_dir=str(run.out_dir),
        predicted_tau_chain=evaluated.predicted_tau_chain,  # held-out records
        predicted_tau_chain_first_answers=evaluated.predicted_tau_chain_first_answers,
        heldout_predicted_tau=decoded.heldout_values(),  # per speculative method, at the decode horizon
        heldout_prediction_method=decoded.heldout_values("method"),
        served_predicted_tau_chain=decoded.served_tau_chain(),  # per prompt set, on the text it served
        decode=decoded,  # decode_runs puts the user-like sets first
        doctor_ok=doctored.ok,
        prompt_set_kind=prompt_set_kinds(run.preset.decode),
    )
    atomic_write_json(run.path("summary.json"), summary.to_json())
    return summary
