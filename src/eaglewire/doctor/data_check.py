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
from collections.abc import Sequence
from dataclasses import dataclass

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
) -> DataWiring:
    """Match every stored column of up to `max_records` records against every boundary of `target`.

    records: aux [T, A*Ht], final [T, Ht], input_ids [T]. Returns the actual wiring and a
    CheckResult whose rows print declared vs actual per column.
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
    _check_storage_dtype(contract, stored_dtype, result)

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
    _wiring_findings(contract, L, aux_matches, aux_actual, final_match, final_actual, result)
    _precision_findings(contract, matches, strict, live_dtype, stored_dtype, result)
    result.notes.append(
        f"{len(sample)} record(s), live target in {live_dtype}, stored {stored_dtype}, tolerance {strict:.0e}"
    )
    return DataWiring(aux=aux_actual, final=final_actual, result=result)


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


def _check_storage_dtype(contract: Contract, stored: str, result: CheckResult) -> None:
    if DTYPE_BITS.get(stored, 32) < DTYPE_BITS.get(contract.dtype, 32):
        result.findings.append(
            Finding(
                check="data.dtype",
                severity="warning",
                what="states are stored in less precision than the contract's dtype",
                declared=f"contract dtype {contract.dtype}",
                actual=f"stored {stored}",
                fix=f"set the contract's dtype to {stored} or recapture storing {contract.dtype}",
            )
        )


def _wiring_findings(
    contract: Contract,
    L: int,
    aux_matches: Sequence[ColumnMatch],
    aux_actual: tuple[StateKey | None, ...],
    final_match: ColumnMatch | None,
    final_actual: StateKey | None,
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
        if all(b is not None for b in actual_bounds):
            bounds = [int(b) for b in actual_bounds if b is not None]
            final_txt = (
                f", final = boundary {final_actual.boundary} {final_actual.norm}-norm" if final_actual else ""
            )
            fix = (
                f"the tensors are right, the labels are wrong: set the data contract to aux_boundaries={fmt_list(bounds)}"
                f"{final_txt}{SERVE_HINT} on this data learned exactly those: train/serve it with them; "
                f"{engine_ids_hint(bounds, L)})"
            )
        else:
            fix = "recapture the data from this target with `eaglewire data capture` (the states cannot be relabelled)"
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
            fix = f"set the data contract's final.norm to '{final_actual.norm}' (engines feed the pre-norm state), or recapture with `eaglewire data capture --final-norm {declared_final.norm}`"
        else:
            what = "the column labelled final is another state"
            fix = (
                f"set the data contract's final to boundary {final_actual.boundary} {final_actual.norm}-norm"
                if final_actual
                else "recapture the data from this target"
            )
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
            fix="set the data contract's dtype to the one the target really ran in (bfloat16), or recapture in "
            f"{contract.dtype}",
            details=tuple(f"{m.name}: distance {m.best_distance:.1e}" for m in loose),
        )
    )
