"""Run every check the given inputs allow, in dependency order, and collect one report.

Order matters: the data check finds which boundaries the stored columns really are; those (the
values, not the labels) are what the draft was trained on, so the serving lints and the
standalone accuracy compare the engines' readings against them. Without data, the draft's
contract says what it was trained on.

`diagnose` takes live objects (tests, the Python API); `run_doctor` loads them from paths (CLI).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from eaglewire.contract.contract import CONTRACT_FILE, Contract
from eaglewire.contract.numbering import SGLANG_GENERATIONS
from eaglewire.data.types import CapturedRecord
from eaglewire.doctor.data_check import CHECK as DATA_CHECK
from eaglewire.doctor.data_check import DataWiring, check_data_against_target
from eaglewire.doctor.draft_check import check_draft
from eaglewire.doctor.draft_source import DraftSource, load_engine_draft, read_draft_source
from eaglewire.doctor.findings import DoctorReport, Finding, fmt_list, skipped
from eaglewire.doctor.serving_common import ServedReading
from eaglewire.doctor.sglang_lint import lint_sglang, parse_sglang_args
from eaglewire.doctor.standalone import CHECK as STANDALONE_CHECK
from eaglewire.doctor.standalone import LabelSource, check_standalone
from eaglewire.doctor.trace import DEFAULT_TRACE_SPEC, run_trace
from eaglewire.doctor.vllm_lint import lint_vllm, load_vllm_config
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
    sglang_generation: str | None = None
    vllm_config: Path | None = None
    trace: bool = False
    prompt: str | None = None
    target_dtype: str | None = None  # default: the dtype the data/draft contract says the target ran in
    max_records: int = 4
    max_tokens: int = 128
    accuracy_labels: str | None = None  # "target" (training's metric; default with --target) | "tokens"

    def validate(self) -> None:
        if not any((self.draft, self.target, self.data, self.sglang_args, self.vllm_config)):
            raise ConfigError(
                "doctor: nothing to check",
                fix="pass at least one of --draft, --target, --data, --sglang-args, --vllm-config",
            )
        if self.sglang_generation is not None and self.sglang_generation not in SGLANG_GENERATIONS:
            raise ConfigError(
                f"--sglang-generation: expected one of {sorted(SGLANG_GENERATIONS)}, got {self.sglang_generation!r}"
            )
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
    sglang_generation: str | None = None,
    vllm_config: dict[str, Any] | None = None,
    trace_prompt: str | None = None,
    max_records: int = 4,
    max_tokens: int = 128,
    accuracy_labels: LabelSource | None = None,
) -> DoctorReport:
    """Every check the inputs allow. `draft_model` is the loaded eaglewire draft (standalone, trace)."""
    report = DoctorReport()
    sample = _sample(records, max_records) if records is not None else None
    wiring: DataWiring | None = None
    if sample is not None and data_contract is not None:
        if target is not None:
            wiring = check_data_against_target(
                sample, data_contract, target, max_records=max_records, max_tokens=max_tokens
            )
            report.checks.append(wiring.result)
        else:
            report.checks.append(skipped(DATA_CHECK, "needs --target to recompute the states"))
    draft_contract = draft_source.contract if draft_source is not None else None
    if draft_source is not None:
        draft_result = check_draft(draft_source, target=target, data_contract=data_contract)
        if wiring is not None and draft_contract is not None and data_contract is not None:
            draft_result.findings += mislabelled_draft_findings(
                draft_source, draft_contract, data_contract, wiring
            )
        report.checks.append(draft_result)

    trained, trained_from = _trained_boundaries(wiring, draft_contract, data_contract)
    ref = draft_contract or data_contract
    num_layers = target.num_layers if target is not None else (ref.target.num_layers if ref else None)
    architecture = target.architecture if target is not None else (ref.target.architecture if ref else None)
    readings: list[ServedReading] = []
    if sglang_args is not None:
        lint = lint_sglang(
            sglang_args,
            draft=draft_source,
            num_layers=num_layers,
            trained=trained,
            trained_from=trained_from,
            generation=sglang_generation,
            architecture=architecture,
        )
        report.checks.append(lint.result)
        readings += lint.readings
    if vllm_config is not None:
        vlint = lint_vllm(
            vllm_config, draft=draft_source, num_layers=num_layers, trained=trained, trained_from=trained_from
        )
        report.checks.append(vlint.result)
        readings += vlint.readings

    if draft_model is not None and sample:
        stored = wiring.aux_boundaries if wiring is not None else None
        if stored is None and data_contract is not None and wiring is None:
            stored = data_contract.aux_boundaries
        report.checks.append(
            check_standalone(
                draft_model,
                sample,
                data_boundaries=stored,
                served=readings,
                target=target,
                max_records=max_records,
                max_tokens=max_tokens,
                labels=accuracy_labels,
            )
        )
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


def mislabelled_draft_findings(
    source: DraftSource, draft_contract: Contract, data_contract: Contract, wiring: DataWiring
) -> list[Finding]:
    """A draft whose contract copied the data's (wrong) labels needs the same relabelling as the data."""
    actual = wiring.aux_boundaries
    if actual is None or draft_contract.aux_boundaries != data_contract.aux_boundaries:
        return []  # unknown values, or another mismatch already reported (draft.vs_data_contract)
    if actual == draft_contract.aux_boundaries:
        return []
    return [
        Finding(
            check="draft.contract_vs_data_values",
            severity="error",
            what="the draft's contract repeats the data's labels, but the data it was trained on holds other boundaries",
            declared=f"aux_boundaries {fmt_list(draft_contract.aux_boundaries)} ({source.path / CONTRACT_FILE})",
            actual=f"trained on boundaries {fmt_list(actual)} (by values)",
            fix=f"set aux_boundaries to {fmt_list(actual)} in {source.path / CONTRACT_FILE} (and in the data's manifest), "
            "then export again",
        )
    ]


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


def _trained_boundaries(
    wiring: DataWiring | None, draft_contract: Contract | None, data_contract: Contract | None
) -> tuple[tuple[int, ...] | None, str]:
    """What the draft was trained on: the data's values beat any label."""
    if wiring is not None and wiring.aux_boundaries is not None:
        return wiring.aux_boundaries, "the training data's values"
    if draft_contract is not None:
        return draft_contract.aux_boundaries, "the draft's contract"
    if data_contract is not None:
        return data_contract.aux_boundaries, "the data's contract"
    return None, "unknown"


def run_doctor(opts: DoctorOptions) -> DoctorReport:
    """Load what `opts` names (draft, data shards, target, vLLM config) and run `diagnose`."""
    import torch

    from eaglewire.data.shards import ShardDataset
    from eaglewire.draft.io import load_draft
    from eaglewire.target.loading import load_target

    opts.validate()
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
        sglang_generation=opts.sglang_generation,
        vllm_config=vllm,
        trace_prompt=opts.prompt if opts.trace else None,
        max_records=opts.max_records,
        max_tokens=opts.max_tokens,
        accuracy_labels=cast(LabelSource | None, opts.accuracy_labels),
    )
    if load_note is not None:
        report.checks.append(skipped(STANDALONE_CHECK, load_note))
    return report
