"""Data vs target: which boundary each stored column really is, proven by values.

For a few records, the live target recomputes every boundary 0..L (pre-norm) and the post-norm
final state on the record's own tokens. Each stored column (every Ht-wide slice of `aux`, and
`final`) is compared with every recomputed state; the closest one (median over tokens of the per-token
relative L2 distance, `matching.state_distance`) is what the column *is*, whatever its label says. Declared and actual are
printed side by side; a mismatch is named (shift, swap, missing/extra embedding, pre/post norm,
precision, truncation) with the fix.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglewire.contract.contract import Contract
from eaglewire.contract.fingerprint import StateKey
from eaglewire.data.types import CapturedRecord
from eaglewire.doctor.diagnosis import diagnose_aux, engine_ids_hint, key_text
from eaglewire.doctor.findings import CheckResult, Finding, Row, fmt_list
from eaglewire.doctor.matching import STATE_TOLERANCE, state_distance
from eaglewire.target.capture import capture_all
from eaglewire.target.loading import LoadedTarget, dtype_name

log = logging.getLogger(__name__)

CHECK = "data vs target"
LOOSEST_TOLERANCE = max(STATE_TOLERANCE.values())
DTYPE_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",
}
DTYPE_BITS = {"float64": 64, "float32": 32, "bfloat16": 16, "float16": 16}
# Where the data.aux fix turns from the data to drafts trained on it (the doctor drops that part when a
# draft it checks reads other boundaries).
SERVE_HINT = " (a draft trained"
# What the fixes call the data and the target when the caller did not say how they were given.
DATA_PLACEHOLDER = "DATA_DIR"
RECAPTURE = "recapture the data from this target with `eaglewire data capture`"


def relabel_data_command(
    data: str | Path,
    target: str,
    aux: Sequence[int],
    *,
    final: StateKey | None = None,
    declared_final: StateKey | None = None,
    dtype: str | None = None,
) -> str:
    """The `eaglewire data relabel` command that labels the columns of `data` as `aux` (and the final
    state as `final`, the contract's dtype as `dtype`): flags for the final state only where it differs
    from `declared_final` (the data's label, which relabel keeps by default)."""
    fix = (
        f"eaglewire data relabel --data {shlex.quote(str(data))} --target {shlex.quote(target)} "
        f"--aux-boundaries {','.join(str(b) for b in aux)}"
    )
    if final is not None and declared_final is not None and final.boundary != declared_final.boundary:
        fix = fix + f" --final-boundary {final.boundary}"
    if final is not None and declared_final is not None and final.norm != declared_final.norm:
        fix = fix + f" --final-norm {final.norm}"
    if dtype is not None:
        fix = fix + f" --dtype {dtype}"
    return fix


@dataclass(frozen=True)
class ColumnMatch:
    """Which recomputed state one stored column matches."""

    name: str  # "aux[i]" or "final"
    declared: StateKey | None  # None: a column the label does not mention (extra)
    best: StateKey
    best_distance: float  # mean relative L2 distance over the sampled records
    declared_distance: float

    def actual(self, tolerance: float) -> StateKey | None:
        return self.best if self.best_distance <= tolerance else None


@dataclass
class DataWiring:
    """What the data really holds (None where a column matches nothing), and the check result."""

    aux: tuple[StateKey | None, ...]
    final: StateKey | None
    result: CheckResult
    # the `eaglewire data relabel` command that labels the data as what its values are (None: some
    # column matches no state of the target, or the data could not be matched: only a recapture helps)
    relabel: str | None = None

    @property
    def aux_boundaries(self) -> tuple[int, ...] | None:
        if any(k is None or k.norm != "pre" for k in self.aux):
            return None
        return tuple(k.boundary for k in self.aux if k is not None)


def _tolerance(*dtypes: str) -> float:
    return max(STATE_TOLERANCE.get(d, LOOSEST_TOLERANCE) for d in dtypes)


def _columns(record: CapturedRecord, ht: int, n_tokens: int) -> dict[str, torch.Tensor]:
    aux = record.aux[:n_tokens]  # [T, A*Ht]
    cols = {f"aux[{i}]": aux[:, i * ht : (i + 1) * ht] for i in range(aux.shape[-1] // ht)}
    cols["final"] = record.final[:n_tokens]  # [T, Ht]
    return cols


def _identity_findings(contract: Contract, target: LoadedTarget) -> list[Finding]:
    t = contract.target
    out = []
    for field, declared, actual in (
        ("num_layers", t.num_layers, target.num_layers),
        ("hidden_size", t.hidden_size, target.hidden_size),
        ("vocab_size", t.vocab_size, target.vocab_size),
    ):
        if declared != actual:
            out.append(
                Finding(
                    check=f"data.target.{field}",
                    severity="error",
                    what=f"the data was captured from another target ({field} differs)",
                    declared=f"{field}={declared} ({t.name or 'data contract'})",
                    actual=f"{field}={actual} ({target.path})",
                    fix=f"pass the target the data was captured from (--target {t.name or '<its path>'}), or recapture",
                )
            )
    return out


def _sample(records: Sequence[CapturedRecord], max_records: int) -> list[CapturedRecord]:
    if len(records) <= max_records:
        return list(records)
    step = len(records) / max_records
    return [records[int(i * step)] for i in range(max_records)]


def check_data_against_target(
    records: Sequence[CapturedRecord],
    contract: Contract,
    target: LoadedTarget,
    *,
    max_records: int = 4,
    max_tokens: int = 128,
    data_path: str | Path | None = None,
    target_arg: str | None = None,
) -> DataWiring:
    """Match every stored column of up to `max_records` records against every boundary of `target`.

    records: aux [T, A*Ht], final [T, Ht], input_ids [T]. Returns the actual wiring and a
    CheckResult whose rows print declared vs actual per column. `data_path` and `target_arg` (the
    shard directory and the target as the user gave them) are what the fixes' commands name.
    """
    result = CheckResult(name=CHECK)
    L, ht = target.num_layers, target.hidden_size
    if not records:
        result.skipped = True
        result.notes.append("the dataset has no records")
        return DataWiring(aux=(), final=None, result=result)
    ident = _identity_findings(contract, target)
    if ident:
        result.findings += ident
        result.notes.append("value matching skipped: the target's shape differs from the data's")
        return DataWiring(aux=(), final=None, result=result)

    sample = _sample(records, max_records)
    stored_dtype = DTYPE_NAMES.get(sample[0].aux.dtype, str(sample[0].aux.dtype))
    live_dtype = dtype_name(target.dtype)
    strict = _tolerance(contract.dtype, live_dtype, stored_dtype)
    widths = {int(r.aux.shape[-1]) for r in sample}
    width = widths.pop() if len(widths) == 1 else None
    if width is None or width % ht:
        result.findings.append(
            Finding(
                check="data.aux_width",
                severity="error",
                what="aux is not a whole number of Ht-wide columns",
                declared=f"A*Ht = {contract.num_aux}*{ht} = {contract.aux_width}",
                actual=f"aux widths {sorted({int(r.aux.shape[-1]) for r in sample})}",
                fix="recapture the dataset (eaglewire data capture); a truncated or mixed aux cannot be relabelled",
            )
        )
    _check_lengths(sample, result)

    per_col: dict[str, dict[StateKey, list[float]]] = {}
    for rec in sample:
        n = min(int(rec.input_ids.shape[0]), int(rec.aux.shape[0]), int(rec.final.shape[0]), max_tokens)
        states = capture_all(target.model, rec.input_ids[:n].unsqueeze(0).to(target.device))
        cols = _columns(rec, ht, n) if width is not None and width % ht == 0 else {"final": rec.final[:n]}
        for name, col in cols.items():
            dists = per_col.setdefault(name, {})
            for key, st in states.items():
                dists.setdefault(key, []).append(state_distance(col, st[0]))

    declared_keys = {f"aux[{i}]": StateKey(b) for i, b in enumerate(contract.aux_boundaries)}
    declared_keys["final"] = StateKey(contract.final.boundary, contract.final.norm)
    matches = []
    for name, dists in per_col.items():
        mean = {k: sum(v) / len(v) for k, v in dists.items()}
        best = min(mean, key=lambda k: mean[k])
        dec = declared_keys.get(name)
        matches.append(
            ColumnMatch(name, dec, best, mean[best], mean.get(dec, float("inf")) if dec else float("inf"))
        )

    aux_matches = [m for m in matches if m.name != "final"]
    final_match = next((m for m in matches if m.name == "final"), None)
    for m in matches:
        act = m.actual(LOOSEST_TOLERANCE)
        ok = act == m.declared and m.best_distance <= strict
        result.rows.append(
            Row(
                item=m.name,
                declared=key_text(m.declared, L) if m.declared else "(not in the label)",
                actual=key_text(act, L),
                ok=ok,
                note=f"distance {m.best_distance:.1e}",
            )
        )
    missing = [name for name in declared_keys if name not in per_col and name != "final"]
    for name in missing:
        result.rows.append(
            Row(item=name, declared=key_text(declared_keys[name], L), actual="(no such column)", ok=False)
        )

    aux_actual = tuple(m.actual(LOOSEST_TOLERANCE) for m in aux_matches)
    final_actual = final_match.actual(LOOSEST_TOLERANCE) if final_match else None
    relabel = _relabel_to_values(
        contract,
        aux_actual,
        final_actual,
        matches,
        strict,
        stored_dtype,
        result,
        data_path,
        target_arg,
        target,
    )
    _check_storage_dtype(contract, stored_dtype, relabel, result)
    _wiring_findings(contract, L, aux_matches, aux_actual, final_match, final_actual, relabel, result)
    _precision_findings(contract, matches, strict, live_dtype, stored_dtype, relabel, result)
    result.notes.append(
        f"{len(sample)} record(s), live target in {live_dtype}, stored {stored_dtype}, tolerance {strict:.0e}"
    )
    return DataWiring(aux=aux_actual, final=final_actual, result=result, relabel=relabel)


def _relabel_to_values(
    contract: Contract,
    aux_actual: tuple[StateKey | None, ...],
    final_actual: StateKey | None,
    matches: Sequence[ColumnMatch],
    strict: float,
    stored_dtype: str,
    result: CheckResult,
    data_path: str | Path | None,
    target_arg: str | None,
    target: LoadedTarget,
) -> str | None:
    """The one `eaglewire data relabel` command that labels every column as what its values are, the
    final state included, with the dtype the states were captured in when the label's is finer (None
    when a column matches nothing, or the states and tokens do not line up: only a recapture helps)."""
    if not aux_actual or any(k is None or k.norm != "pre" for k in aux_actual) or final_actual is None:
        return None
    if any(f.check in ("data.length", "data.aux_width") for f in result.findings):
        return None
    dtype = None
    if DTYPE_BITS.get(stored_dtype, 32) < DTYPE_BITS.get(contract.dtype, 32):
        dtype = stored_dtype
    elif any(m.best == m.declared and strict < m.best_distance <= LOOSEST_TOLERANCE for m in matches):
        dtype = "bfloat16"  # what the field's captures run in; float16 states pass its tolerance too
    return relabel_data_command(
        data_path if data_path is not None else DATA_PLACEHOLDER,
        target_arg if target_arg is not None else str(target.path),
        [k.boundary for k in aux_actual if k is not None],
        final=final_actual,
        declared_final=StateKey(contract.final.boundary, contract.final.norm),
        dtype=dtype,
    )


def _check_lengths(sample: Sequence[CapturedRecord], result: CheckResult) -> None:
    for rec in sample:
        t_ids, t_aux, t_final = int(rec.input_ids.shape[0]), int(rec.aux.shape[0]), int(rec.final.shape[0])
        if not t_ids == t_aux == t_final:
            result.findings.append(
                Finding(
                    check="data.length",
                    severity="error",
                    what=f"record {rec.record_id}: states and tokens have different lengths (truncated)",
                    declared=f"input_ids/loss_mask T={t_ids}",
                    actual=f"aux T={t_aux}, final T={t_final}",
                    fix="recapture the states from the tokenized dataset itself "
                    "(`eaglewire data capture --dataset DIR`): they must cover every token",
                )
            )
            return


def _check_storage_dtype(contract: Contract, stored: str, relabel: str | None, result: CheckResult) -> None:
    if DTYPE_BITS.get(stored, 32) < DTYPE_BITS.get(contract.dtype, 32):
        result.findings.append(
            Finding(
                check="data.dtype",
                severity="warning",
                what="states are stored in less precision than the contract's dtype",
                declared=f"contract dtype {contract.dtype}",
                actual=f"stored {stored}",
                fix=(f"relabel the data (the tensors stay as they are): {relabel}, or " if relabel else "")
                + f"recapture storing {contract.dtype} with `eaglewire data capture --dtype {contract.dtype}`",
            )
        )


def _wiring_findings(
    contract: Contract,
    L: int,
    aux_matches: Sequence[ColumnMatch],
    aux_actual: tuple[StateKey | None, ...],
    final_match: ColumnMatch | None,
    final_actual: StateKey | None,
    relabel: str | None,
    result: CheckResult,
) -> None:
    declared_final = StateKey(contract.final.boundary, contract.final.norm)
    aux_ok = len(aux_matches) == contract.num_aux and all(
        a == StateKey(b) for a, b in zip(aux_actual, contract.aux_boundaries, strict=False)
    )
    actual_bounds = [None if k is None or k.norm != "pre" else k.boundary for k in aux_actual]
    if aux_matches and not aux_ok:
        why = diagnose_aux(
            contract.aux_boundaries, actual_bounds, declared_final=declared_final, actual_final=final_actual
        )
        if relabel is not None and all(b is not None for b in actual_bounds):
            bounds = [int(b) for b in actual_bounds if b is not None]
            fix = (
                f"the tensors are right, the labels are wrong: relabel them (proven by values first; the tensors "
                f"are not touched): {relabel}{SERVE_HINT} on this data learned exactly those: train/serve it with "
                f"them; {engine_ids_hint(bounds, L, contract.target.architecture)})"
            )
        elif all(b is not None for b in actual_bounds):
            fix = f"{RECAPTURE} (relabelling cannot help: see this check's other findings)"
        else:
            fix = f"{RECAPTURE} (the states cannot be relabelled: not every column is a state of this target)"
        result.findings.append(
            Finding(
                check="data.aux",
                severity="error",
                what=why,
                declared=f"aux_boundaries {fmt_list(contract.aux_boundaries)}",
                actual=f"values are {fmt_list(['?' if b is None else b for b in actual_bounds])}",
                fix=fix,
                details=tuple(
                    f"{m.name}: labelled {key_text(m.declared, L)}, is {key_text(a, L)} (distance {m.best_distance:.1e})"
                    for m, a in zip(aux_matches, aux_actual, strict=True)
                ),
            )
        )
    if final_match is not None and final_actual != declared_final:
        if final_actual is not None and final_actual.boundary == declared_final.boundary:
            what = f"final state is {final_actual.norm}-norm, the label says {declared_final.norm}-norm"
            fix = (
                (f"relabel the data: {relabel}, or " if relabel else "")
                + f"recapture with `eaglewire data capture --final-norm {declared_final.norm}` "
                "(engines feed the pre-norm state)"
            )
        else:
            what = "the column labelled final is another state"
            fix = f"relabel the data: {relabel}" if relabel and final_actual else RECAPTURE
        result.findings.append(
            Finding(
                check="data.final",
                severity="error",
                what=what,
                declared=key_text(declared_final, L),
                actual=key_text(final_actual, L),
                fix=fix,
                details=(f"distance to best match {final_match.best_distance:.1e}",),
            )
        )


def _precision_findings(
    contract: Contract,
    matches: Sequence[ColumnMatch],
    strict: float,
    live_dtype: str,
    stored_dtype: str,
    relabel: str | None,
    result: CheckResult,
) -> None:
    loose = [m for m in matches if m.best == m.declared and strict < m.best_distance <= LOOSEST_TOLERANCE]
    if not loose:
        return
    worst = max(m.best_distance for m in loose)
    result.findings.append(
        Finding(
            check="data.dtype",
            severity="warning",
            what="the columns are the declared boundaries, but only to low precision: captured in another dtype",
            declared=f"contract dtype {contract.dtype} (tolerance {strict:.0e})",
            actual=f"distance up to {worst:.1e} (live target {live_dtype}, stored {stored_dtype}): bfloat16/float16-level differences",
            fix=(
                f"relabel the data with the dtype the target really ran in: {relabel}, or " if relabel else ""
            )
            + f"recapture in {contract.dtype} with `eaglewire data capture --dtype {contract.dtype}`",
            details=tuple(f"{m.name}: distance {m.best_distance:.1e}" for m in loose),
        )
    )
