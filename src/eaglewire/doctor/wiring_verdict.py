"""What the draft's own accuracy says when the data's columns are not what its labels or the draft's contract
say (`standalone.learned_wiring`): "this data is mislabelled" or "this draft was trained on mislabelled data",
as findings whose fixes name the commands (`doctor.run` docstring); and which boundaries the draft was
trained on, which every serving check compares against."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from eaglewire.contract.contract import CONTRACT_FILE, Contract
from eaglewire.doctor.data_check import SERVE_HINT
from eaglewire.doctor.diagnosis import engine_ids_hint
from eaglewire.doctor.draft_source import DraftSource
from eaglewire.doctor.findings import CheckResult, Finding, fmt_list
from eaglewire.doctor.standalone import WiringVerdict

# What the fixes' commands call the target when the caller did not say how it was given, and the
# directories they write beside a draft (a relabelled copy; an export imported to be relabelled).
TARGET_PLACEHOLDER = "TARGET"
RELABELLED = "-relabelled"
IMPORTED = "-imported"


def reconcile_with_data_values(
    result: CheckResult,
    draft_contract: Contract,
    data_contract: Contract,
    values: tuple[int, ...],
    *,
    explained: bool,
) -> None:
    """The draft-vs-data-contract difference on aux_boundaries, once the data's real boundaries are known.

    When the draft's contract equals the data's values, the data's labels are what is wrong (data vs
    target says so): the draft is fine, nothing to say about it. When the verdict's findings
    (`wiring_verdict_findings`, `explained`) say what the difference means, the plain label difference
    goes; otherwise it stays (the draft was not trained on this data, or nobody can tell).
    """
    if draft_contract.aux_boundaries == data_contract.aux_boundaries:
        return
    if not (explained or draft_contract.aux_boundaries == values):
        return
    result.findings = [
        f for f in result.findings if not (f.check == "draft.vs_data_contract" and "aux_boundaries" in f.what)
    ]
    if draft_contract.aux_boundaries == values:
        result.notes.append(
            f"the draft's contract {fmt_list(draft_contract.aux_boundaries)} is what the data's columns hold by "
            f"values; the data's labels {fmt_list(data_contract.aux_boundaries)} are wrong (see data vs target)"
        )


def data_fix_without_serving_advice(result: CheckResult, verdict: WiringVerdict | None) -> None:
    """The data's relabelling fix, without "train/serve with those" when the draft does not read them."""
    why = (
        "the draft does not read these boundaries, its contract's (see draft vs data): leave the draft as it is"
        if verdict is not None and verdict.learned == "contract"
        else "leave the draft as it is unless its own accuracy shows it learned these (see draft vs data)"
    )
    result.findings = [
        replace(f, fix=f"{f.fix.split(SERVE_HINT)[0]}; {why}")
        if f.check == "data.aux" and SERVE_HINT in f.fix
        else f
        for f in result.findings
    ]


def relabel_draft_command(draft: Path, target: str, aux: Sequence[int]) -> str:
    """The `eaglewire draft relabel` command that writes `draft` rewired to `aux` into `<draft>-relabelled`."""
    fix = (
        f"eaglewire draft relabel --draft {shlex.quote(str(draft))} --target {shlex.quote(target)} "
        f"--aux-boundaries {','.join(str(b) for b in aux)} --out {shlex.quote(str(draft) + RELABELLED)}"
    )
    return fix


def wiring_verdict_findings(
    verdict: WiringVerdict,
    source: DraftSource,
    data_contract: Contract,
    num_layers: int | None,
    *,
    data_relabel: str | None = None,
    target_arg: str | None = None,
) -> list[Finding]:
    """ "This data is mislabelled" or "this draft was trained on mislabelled data", by the draft's own accuracy.

    Never advises changing a draft that reads what its contract says (learned == "contract"), nor one whose
    accuracy does not tell (learned == "unclear"): only the data is then named. `data_relabel` is the data
    check's `eaglewire data relabel` command (`DataWiring.relabel`); `target_arg` the target as given.
    """
    labels, real, mine = data_contract.aux_boundaries, verdict.stored, verdict.contract
    contract_file = source.path / CONTRACT_FILE
    target = target_arg if target_arg is not None else TARGET_PLACEHOLDER
    data_fix = (
        f"relabel the data: {data_relabel}"
        if data_relabel
        else "recapture the data (not all its states can be relabelled: see data vs target)"
    )
    if verdict.learned == "contract":
        if labels == real:
            return []  # the data is labelled right; the draft was trained on other data (draft vs target says if it matches)
        return [
            Finding(
                check="draft.data_mislabelled",
                severity="error",
                what=f"this data is mislabelled: its columns are boundaries {fmt_list(real)}, its labels say "
                f"{fmt_list(labels)}; the draft is fine (it reads its contract's boundaries {fmt_list(mine)})",
                declared=f"the data's labels: aux_boundaries {fmt_list(labels)}",
                actual=f"by values {fmt_list(real)}; the draft: {verdict.evidence()}",
                fix=f"{data_fix}; or recapture it at the draft's boundaries with `eaglewire data capture "
                f"--aux-boundaries {','.join(str(b) for b in mine)}`; do not change the draft",
            )
        ]
    if verdict.learned == "unclear":
        return []
    ids = (
        engine_ids_hint(real, num_layers, data_contract.target.architecture) if num_layers is not None else ""
    )
    trained_on = "mislabelled data" if labels != real else "this data"
    if source.kind == "eaglewire":
        relabel = (
            f"write a copy rewired to them (same config and weights, {CONTRACT_FILE} rebuilt on the target; "
            f"{source.path} is left as it is): {relabel_draft_command(source.path, target, real)}"
        )
    else:
        imported = Path(str(source.path) + IMPORTED)
        relabelled = Path(str(imported) + RELABELLED)
        relabel = (
            f"import it, rewire the draft, export it again (no file edited by hand): `eaglewire import --format "
            f"{source.kind} --src {shlex.quote(str(source.path))} --target {shlex.quote(target)} --out "
            f"{shlex.quote(str(imported))}`, then `{relabel_draft_command(imported, target, real)}`, then "
            f"`eaglewire export --draft {shlex.quote(str(relabelled))} --format {source.kind} --out NEW_EXPORT`"
        )
    return [
        Finding(
            check="draft.contract_vs_data_values",
            severity="error",
            what=f"this draft was trained on {trained_on}: it learned the data's real boundaries {fmt_list(real)}, "
            f"its contract says {fmt_list(mine)}",
            declared=f"aux_boundaries {fmt_list(mine)} ({contract_file})",
            actual=f"it reads {fmt_list(real)}: {verdict.evidence()}",
            fix=f"keep the draft, correct its wiring to aux_boundaries {fmt_list(real)}: serve it with {ids}; {relabel}"
            + (f"; and {data_fix}" if labels != real else ""),
        )
    ]


def boundaries_trained_on(
    values: tuple[int, ...] | None,
    draft_contract: Contract | None,
    data_contract: Contract | None,
    verdict: WiringVerdict | None,
) -> tuple[tuple[int, ...] | None, str]:
    """What the draft was trained on (what serving must feed it), and where that came from.

    The draft's own accuracy decides when it was measured; otherwise a draft's contract is never
    overruled by the data's values (the data may be mislabelled, or not the draft's data); without
    a draft, the data's values beat its labels.
    """
    if verdict is not None:
        if verdict.learned == "data":
            return verdict.stored, "the training data's values"
        if verdict.learned == "contract":
            return verdict.contract, "the draft's contract, confirmed by its accuracy"
        return verdict.contract, "the draft's contract"
    if draft_contract is not None:
        if values == draft_contract.aux_boundaries:
            return values, "the training data's values"
        return draft_contract.aux_boundaries, "the draft's contract"
    if values is not None:
        return values, "the training data's values"
    if data_contract is not None:
        return data_contract.aux_boundaries, "the data's contract"
    return None, "unknown"
