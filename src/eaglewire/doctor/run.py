"""Run every check the given inputs allow, in dependency order, and collect one report.

Order matters: the data check finds which boundaries the stored columns really are (by values).
When they differ from the draft's contract, the draft's own step-0 accuracy under both wirings
(`standalone.learned_wiring`) says which one it learned: its contract's ("this data is
mislabelled": the draft is left alone) or the data's real boundaries ("this draft was trained on
mislabelled data": its wiring is corrected). What it learned is what the export check, the serving
lints and the standalone accuracy compare the engines' readings against. A draft's contract is
never overruled without that measurement; without a draft, the data's values beat its labels.

`diagnose` takes live objects (tests, the Python API); `run_doctor` loads them from paths (CLI).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from eaglewire.contract.contract import Contract
from eaglewire.contract.numbering import parse_version
from eaglewire.data.types import CapturedRecord
from eaglewire.doctor.data_check import CHECK as DATA_CHECK
from eaglewire.doctor.data_check import DataWiring, check_data_against_target
from eaglewire.doctor.draft_check import check_draft
from eaglewire.doctor.draft_source import DraftSource, load_engine_draft, read_draft_source
from eaglewire.doctor.export_check import check_export
from eaglewire.doctor.findings import DoctorReport, skipped
from eaglewire.doctor.served_client import served_client_for
from eaglewire.doctor.serving_common import ServedReading
from eaglewire.doctor.sglang_lint import lint_sglang, parse_sglang_args
from eaglewire.doctor.standalone import CHECK as STANDALONE_CHECK
from eaglewire.doctor.standalone import LabelSource, WiringVerdict, check_standalone, learned_wiring
from eaglewire.doctor.trace import DEFAULT_TRACE_SPEC, run_trace
from eaglewire.doctor.vllm_lint import lint_vllm, load_vllm_config
from eaglewire.doctor.wiring_verdict import (
    boundaries_trained_on,
    data_fix_without_serving_advice,
    reconcile_with_data_values,
    wiring_verdict_findings,
)
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.spec_args import SpecArgs, sglang_effective_spec_args
from eaglewire.errors import CheckpointError, ConfigError
from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)


class RecordSource(Protocol):
    """A list of records or a ShardDataset: anything indexable with a length."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> CapturedRecord: ...


@dataclass(frozen=True)
class DoctorOptions:
    """What `eaglewire doctor` was given (paths and strings; nothing loaded yet)."""

    draft: Path | None = None
    target: str | None = None
    data: Path | None = None
    sglang_args: str | None = None
    sglang_version: str | None = None  # the SGLang release served with (--sglang-version)
    vllm_version: str | None = None  # the vLLM release served with (--vllm-version)
    vllm_config: Path | None = None
    trace: bool = False
    prompt: str | None = None
    target_dtype: str | None = None  # default: the dtype the data/draft contract says the target ran in
    max_records: int = 4
    max_tokens: int = 128
    accuracy_labels: str | None = None  # "target" (training's metric; default with --target) | "tokens"
    # a live server's acceptance (`doctor.served`): its URL, its kind, the prompts sent (None: the default mix)
    served: str | None = None
    engine: str | None = None
    prompts: str | None = None
    num_prompts: int | None = None
    concurrency: int = 1  # --served: clients sending at once

    def validate(self) -> None:
        from eaglewire.doctor.served_client import validate_served_flags

        validate_served_flags(self)
        if not any((self.draft, self.target, self.data, self.sglang_args, self.vllm_config)):
            raise ConfigError(
                "doctor: nothing to check",
                fix="pass at least one of --draft, --target, --data, --sglang-args, --vllm-config",
            )
        for flag, version in (
            ("--sglang-version", self.sglang_version),
            ("--vllm-version", self.vllm_version),
        ):
            if version is not None:
                parse_version(version, flag=flag)
        if self.trace and not (self.target and self.draft and self.prompt):
            raise ConfigError(
                "--trace needs --target, --draft and --prompt TEXT", fix="add the missing option(s)"
            )
        if self.prompt and not self.trace:
            raise ConfigError("--prompt is only used with --trace", fix="add --trace")
        if self.accuracy_labels not in (None, "target", "tokens"):
            raise ConfigError(
                f"--accuracy-labels: expected 'target' or 'tokens', got {self.accuracy_labels!r}"
            )
        if self.accuracy_labels == "target" and not self.target:
            raise ConfigError(
                "--accuracy-labels target needs --target", fix="add --target, or use --accuracy-labels tokens"
            )
        if self.max_records < 1 or self.max_tokens < 3:
            raise ConfigError(
                f"--max-records must be >= 1 and --max-tokens >= 3, got {self.max_records}, {self.max_tokens}"
            )


def _sample(records: RecordSource, n: int) -> list[CapturedRecord]:
    if len(records) <= n:
        return [records[i] for i in range(len(records))]
    return [records[int(i * len(records) / n)] for i in range(n)]


def diagnose(
    *,
    target: LoadedTarget | None = None,
    records: RecordSource | None = None,
    data_contract: Contract | None = None,
    draft_source: DraftSource | None = None,
    draft_model: Eagle3Draft | None = None,
    sglang_args: str | None = None,
    sglang_version: str | None = None,
    vllm_version: str | None = None,
    vllm_config: dict[str, Any] | None = None,
    trace_prompt: str | None = None,
    max_records: int = 4,
    max_tokens: int = 128,
    accuracy_labels: LabelSource | None = None,
    data_path: Path | None = None,
    target_arg: str | None = None,
) -> DoctorReport:
    """Every check the inputs allow. `draft_model` is the loaded draft (standalone accuracy, trace).
    `data_path` and `target_arg` (the shard directory and the target as given) are what fixes name."""
    report = DoctorReport()
    sample = _sample(records, max_records) if records is not None else None
    wiring: DataWiring | None = None
    if sample is not None and data_contract is not None:
        if target is not None:
            wiring = check_data_against_target(
                sample,
                data_contract,
                target,
                max_records=max_records,
                max_tokens=max_tokens,
                data_path=data_path,
                target_arg=target_arg,
            )
            report.checks.append(wiring.result)
        else:
            report.checks.append(skipped(DATA_CHECK, "needs --target to recompute the states"))
    draft_contract = draft_source.contract if draft_source is not None else None
    # what the data's columns really are (None: unknown, e.g. the data is from a target of another shape)
    values = (wiring.aux_boundaries or None) if wiring is not None else None
    verdict: WiringVerdict | None = None
    if (
        draft_model is not None
        and draft_contract is not None
        and target is not None
        and sample
        and values is not None
        and values != draft_contract.aux_boundaries
        and len(values) == draft_contract.num_aux
    ):
        verdict = learned_wiring(
            draft_model,
            sample,
            stored=values,
            contract=draft_contract.aux_boundaries,
            target=target,
            labels=accuracy_labels,
            max_records=max_records,
            max_tokens=max_tokens,
        )
    verdict_findings = (
        wiring_verdict_findings(
            verdict,
            draft_source,
            data_contract,
            target.num_layers if target else None,
            data_relabel=wiring.relabel if wiring is not None else None,
            target_arg=target_arg if target_arg is not None else (str(target.path) if target else None),
        )
        if verdict is not None and draft_source is not None and data_contract is not None
        else []
    )
    if draft_source is not None:
        draft_result = check_draft(draft_source, target=target, data_contract=data_contract)
        if values is not None and draft_contract is not None and data_contract is not None:
            reconcile_with_data_values(
                draft_result, draft_contract, data_contract, values, explained=bool(verdict_findings)
            )
        report.checks.append(draft_result)
    if (
        wiring is not None
        and values is not None
        and draft_contract is not None
        and values != draft_contract.aux_boundaries
        and (verdict is None or verdict.learned != "data")
    ):
        data_fix_without_serving_advice(wiring.result, verdict)

    trained, trained_from = boundaries_trained_on(values, draft_contract, data_contract, verdict)
    ref = draft_contract or data_contract
    num_layers = target.num_layers if target is not None else (ref.target.num_layers if ref else None)
    architecture = target.architecture if target is not None else (ref.target.architecture if ref else None)
    readings: list[ServedReading] = []
    exported: Path | None = None
    if draft_source is not None and draft_source.kind != "eaglewire":
        export = check_export(
            draft_source,
            target=target,
            trained=trained,
            trained_from=trained_from,
            version=sglang_version if draft_source.kind == "sglang" else vllm_version,
        )
        report.checks.append(export.result)
        readings += export.readings
        exported = draft_source.path
    if sglang_args is not None:
        lint = lint_sglang(
            sglang_args,
            draft=draft_source,
            num_layers=num_layers,
            trained=trained,
            trained_from=trained_from,
            version=sglang_version,
            architecture=architecture,
            ids_checked=exported,
        )
        report.checks.append(lint.result)
        readings += lint.readings
    if vllm_config is not None:
        vlint = lint_vllm(
            vllm_config,
            draft=draft_source,
            num_layers=num_layers,
            trained=trained,
            trained_from=trained_from,
            ids_checked=exported,
            architecture=architecture,
            version=vllm_version,
        )
        report.checks.append(vlint.result)
        readings += vlint.readings
    readings = list({(r.label, r.boundaries, r.ids): r for r in readings}.values())

    if draft_model is not None and sample:
        stored = values
        if stored is None and data_contract is not None and wiring is None:
            stored = data_contract.aux_boundaries
        standalone = check_standalone(
            draft_model,
            sample,
            data_boundaries=stored,
            served=readings,
            target=target,
            max_records=max_records,
            max_tokens=max_tokens,
            labels=accuracy_labels,
            verdict=verdict,
        )
        standalone.findings += verdict_findings
        report.checks.append(standalone)
    elif draft_source is not None and sample and draft_model is None and target is None:
        report.checks.append(
            skipped(STANDALONE_CHECK, f"{draft_source.kind} export: needs --target to load its weights")
        )
    if trace_prompt is not None:
        if target is None or draft_model is None or draft_contract is None:
            raise ConfigError("--trace needs --target and an eaglewire --draft (with contract.json)")
        report.trace = run_trace(
            target, draft_model, draft_contract, trace_prompt, spec=_trace_spec(sglang_args, target)
        )
    return report


def _trace_spec(sglang_args: str | None, target: LoadedTarget) -> SpecArgs:
    """Trace with what SGLang would really run for --sglang-args (after its rewrites), else a chain of 3."""
    if sglang_args is None:
        return DEFAULT_TRACE_SPEC
    a = parse_sglang_args(sglang_args)
    try:
        spec, _ = sglang_effective_spec_args(
            a.num_steps, a.topk, a.num_draft_tokens, architecture=target.architecture
        )
    except ConfigError:
        return DEFAULT_TRACE_SPEC  # SGLang would refuse these; the lint says so
    return spec


def run_doctor(opts: DoctorOptions) -> DoctorReport:
    """Load what `opts` names (draft, data shards, target, vLLM config) and run `diagnose`."""
    import torch

    from eaglewire.data.shards import ShardDataset
    from eaglewire.draft.io import load_draft
    from eaglewire.target.loading import load_target

    opts.validate()
    served = served_client_for(opts)  # reachable before anything loads
    draft_source = read_draft_source(opts.draft) if opts.draft is not None else None
    draft_model = None
    if draft_source is not None and draft_source.kind == "eaglewire":
        draft_model, _ = load_draft(draft_source.path, dtype=torch.float32)
    records, data_contract = None, None
    if opts.data is not None:
        dataset = ShardDataset(opts.data)
        records, data_contract = dataset, dataset.contract
    target = None
    if opts.target is not None:
        ref = data_contract or (draft_source.contract if draft_source else None)
        dtype = opts.target_dtype or (ref.dtype if ref is not None else "float32")
        target = load_target(opts.target, dtype=dtype)
    load_note = None
    if (
        draft_source is not None
        and draft_source.kind != "eaglewire"
        and target is not None
        and records is not None
    ):
        try:
            draft_model = load_engine_draft(draft_source, target)
        except (CheckpointError, ConfigError) as e:  # the static checks still run and name the problem
            load_note = (
                f"{draft_source.kind} export not loadable for the standalone check: {str(e).splitlines()[0]}"
            )
    vllm = load_vllm_config(opts.vllm_config) if opts.vllm_config is not None else None
    report = diagnose(
        target=target,
        records=records,
        data_contract=data_contract,
        draft_source=draft_source,
        draft_model=draft_model,
        sglang_args=opts.sglang_args,
        sglang_version=opts.sglang_version,
        vllm_version=opts.vllm_version,
        vllm_config=vllm,
        trace_prompt=opts.prompt if opts.trace else None,
        max_records=opts.max_records,
        max_tokens=opts.max_tokens,
        accuracy_labels=cast(LabelSource | None, opts.accuracy_labels),
        data_path=opts.data,
        target_arg=opts.target,
    )
    if load_note is not None:
        report.checks.append(skipped(STANDALONE_CHECK, load_note))
    if served is not None and target is not None and draft_source is not None:
        from eaglewire.doctor.served import served_check_for

        report.checks.append(served_check_for(opts, served, target, draft_source, draft_model, vllm))
    return report
