"""An SGLang or vLLM/speculators export, read the way its engine will read it (no serving arguments needed).

`eaglewire doctor --draft EXPORT` used to trust the export's contract.json; the engine never reads
it. This check reads what the engine does, with the engine's rules (`eaglewire.export.keys` names
the code each rule comes from):

- layer ids: SGLang `eagle_config.eagle_aux_hidden_state_layer_ids`, vLLM the top-level
  `eagle_aux_hidden_state_layer_ids` (its V1 runner falls back to the nested key, its V2 runner to
  the target's defaults), each read with the engine table (`eaglewire.contract.numbering.
  ENGINE_RULES`) for the target's architecture: the release `--sglang-version` / `--vllm-version`
  or the export's own export.json names, else every release read. The boundaries the engine will
  capture (in layer order; boundary 0 / L only where that release captures them) are compared with
  what the draft was trained on, and with a live target **by values**: each captured state on the
  contract's probe against the fingerprint of the aux state the draft was trained on.
- every other key the engine reads (`export_config_check`): `draft_vocab_size` against the weights,
  `target_hidden_size` against fc.weight (both engines build fc `target_hidden_size * 3` wide), the
  contract and the target; `hidden_size`, `vocab_size`, the single layer, `tie_word_embeddings`,
  SGLang's fc `bias` and `use_aux_hidden_state`; norm flags (vLLM reads `norm_before_residual`,
  absent = true); the speculators block (algorithm, speculative_tokens, the verifier's architecture).

d2t/t2d range and agreement are `draft_check.check_vocab_map`'s (the same for every format).
Every finding names the file, the key, the value in it, what the engine does with it, and the
value to write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglewire.contract.contract import Contract
from eaglewire.contract.fingerprint import (
    StateKey,
    TensorFingerprint,
    distance,
    match_fingerprint,
    summarize,
    tolerance_for,
)
from eaglewire.contract.numbering import capturable_boundaries, engine_ids, engine_rules
from eaglewire.doctor.diagnosis import describe_boundaries, diagnose_aux
from eaglewire.doctor.draft_source import IDS_KEY, SGLANG_NESTED, DraftSource
from eaglewire.doctor.export_config_check import ENGINE_NAME, check_export_config
from eaglewire.doctor.findings import CheckResult, Finding, Row, fmt_list
from eaglewire.doctor.serving_common import ServedReading, ServingLint
from eaglewire.doctor.sglang_lint import sglang_readings
from eaglewire.doctor.vllm_lint import vllm_readings
from eaglewire.errors import BoundaryError, EaglewireError
from eaglewire.target.identity import states_on_probe
from eaglewire.target.loading import LoadedTarget, dtype_name
from eaglewire.typed_config import read_json_file

CHECK = {"sglang": "export: sglang", "vllm": "export: vllm"}
IDS_KEYS = {"sglang": f"{SGLANG_NESTED}.{IDS_KEY}", "vllm": IDS_KEY}
EXPORT_MANIFEST = "export.json"  # eaglewire.export.exporting writes it (layer_ids, engine_version)


@dataclass(frozen=True)
class Trained:
    """What the draft was trained on, where that came from, and (with a target) its values on the probe."""

    boundaries: tuple[int, ...] | None
    source: str
    fingerprint_aux: tuple[TensorFingerprint, ...] = ()  # per aux column (the by-values comparison)
    tolerance: float = 0.0
    states: dict[StateKey, torch.Tensor] | None = None  # the live target's states on the probe


def check_export(
    source: DraftSource,
    *,
    target: LoadedTarget | None,
    trained: Sequence[int] | None,
    trained_from: str,
    version: str | None = None,
) -> ServingLint:
    """Read `source` (an SGLang or vLLM export) as its engine will; compare with `trained` and the target.

    version: the engine release the user serves with (--sglang-version / --vllm-version for this engine)."""
    engine = source.kind
    if engine not in CHECK:
        raise ValueError(f"check_export: not an engine export: {source.kind}")
    result = CheckResult(name=CHECK[engine])
    cfg_path = source.path / "config.json"
    contract = source.contract
    num_layers = (
        target.num_layers if target is not None else (contract.target.num_layers if contract else None)
    )
    architecture = (
        target.architecture if target is not None else (contract.target.architecture if contract else None)
    )
    readings: list[ServedReading] = []
    if num_layers is None:
        result.notes.append(
            f"{source.path}: no contract.json and no --target: the number of target layers is unknown, "
            "layer ids not read (pass --target)"
        )
    else:
        known = _trained_by_values(
            contract, target, tuple(trained) if trained is not None else None, trained_from, result
        )
        assert architecture is not None  # known with the layer count (target or contract)
        readings = _layer_ids(source, engine, cfg_path, num_layers, architecture, known, version, result)
    check_export_config(source, contract, target, result)
    return ServingLint(result=result, readings=readings)


# --- layer ids ----------------------------------------------------------------------------------


def _trained_by_values(
    contract: Contract | None,
    target: LoadedTarget | None,
    trained: tuple[int, ...] | None,
    trained_from: str,
    result: CheckResult,
) -> Trained:
    """`trained`, proven on the live target when it is the contract's: each fingerprinted aux state's
    best-matching boundary (a mislabelled contract is caught here, not trusted)."""
    fp = contract.fingerprint if contract is not None else None
    if (
        contract is None
        or fp is None
        or target is None
        or trained != contract.aux_boundaries
        or (target.num_layers, target.hidden_size)
        != (contract.target.num_layers, contract.target.hidden_size)
    ):
        return Trained(trained, trained_from)
    states = states_on_probe(target, fp.probe_ids)
    aux = tuple(t for t in fp.tensors if t.name.startswith("aux["))
    tol = tolerance_for(fp.dtype, dtype_name(target.dtype))
    matches = [
        m
        for m in match_fingerprint(fp, states, live_dtype=dtype_name(target.dtype))
        if m.name.startswith("aux[")
    ]
    if len(aux) != len(trained) or any(m.best_distance > tol for m in matches):
        result.notes.append(
            "the contract's fingerprint does not match this target by values (see draft vs target): ids compared "
            "with the contract's labels only"
        )
        return Trained(trained, trained_from)
    values = tuple(m.best.boundary for m in matches)
    if values != trained:
        return Trained(values, "the draft contract's fingerprint, by values on this target", aux, tol, states)
    return Trained(trained, f"{trained_from}, confirmed by values on this target", aux, tol, states)


def _export_version(source: DraftSource, ids: Sequence[int] | None) -> str | None:
    """The engine release the export was written for (export.json), when its ids are still the file's."""
    path = source.path / EXPORT_MANIFEST
    if ids is None or not path.is_file():
        return None
    try:
        manifest = read_json_file(path)
    except (EaglewireError, OSError):  # export.json is informational here: unreadable = not stated
        return None
    if not isinstance(manifest, dict) or manifest.get("layer_ids") != list(ids):
        return None
    version = manifest.get("engine_version")
    return version if isinstance(version, str) else None


def _id_range(engine: str, architecture: str, num_layers: int) -> str:
    """The boundaries every release read of this engine captures on this target (what valid ids may name)."""
    capturable = capturable_boundaries(engine, architecture, num_layers)
    if capturable is None:
        return f"none ({ENGINE_NAME[engine]} serves no EAGLE-3 draft for {architecture})"
    lo, hi = capturable
    return f"ids naming boundaries {lo}..{hi} of this {num_layers}-layer target, in increasing order"


def _fix_ids(
    engine: str, architecture: str, trained: Sequence[int], num_layers: int, version: str | None
) -> tuple[str, str]:
    """(the value to write, the sentence saying so) for `trained` in this engine's numbering."""
    try:
        ids = engine_ids(engine, architecture, trained, num_layers, version).ids
    except BoundaryError as e:
        return (
            "",
            f"no {ENGINE_NAME[engine]} ids serve boundaries {fmt_list(trained)}: {str(e).splitlines()[0]}"
            + (f" ({e.fix})" if e.fix else ""),
        )
    return fmt_list(ids), ""


def _layer_ids(
    source: DraftSource,
    engine: str,
    cfg_path: Path,
    num_layers: int,
    architecture: str,
    trained: Trained,
    version: str | None,
    result: CheckResult,
) -> list[ServedReading]:
    key = IDS_KEYS[engine]
    if engine == "sglang":
        ids = source.nested_ids
        if ids is None and source.top_ids is not None:
            ids = source.top_ids
            result.notes.append(
                f"{cfg_path}: layer ids only at the top level ({IDS_KEY}); SGLang releases without the top-level "
                f"fallback capture their defaults instead: write them under {SGLANG_NESTED}"
            )
    else:
        ids = source.top_ids
    stated = version
    if stated is None:
        stated = _export_version(source, ids)
        if stated is not None:
            result.notes.append(f"{ENGINE_NAME[engine]} {stated} from {source.path / EXPORT_MANIFEST}")
    if engine == "sglang":
        readings = sglang_readings(ids, num_layers, trained.boundaries, stated, architecture)
    else:
        readings = vllm_readings(source, num_layers, trained.boundaries, architecture, stated)
    fix_value, why_not = (
        _fix_ids(engine, architecture, trained.boundaries, num_layers, stated)
        if trained.boundaries is not None
        else ("", "")
    )
    fix = (
        f"set {key} to {fix_value} in {cfg_path}"
        if fix_value
        else why_not
        or f"set {key} to the ids of the boundaries the draft was trained on (see `eaglewire ids`)"
    )
    if fix_value and stated is None and len(engine_rules(engine, architecture)) > 1:
        fix += f" (every {ENGINE_NAME[engine]} release read reads it alike)"
    for r in readings:
        shown = "absent (engine defaults)" if r.ids is None else fmt_list(r.ids)
        captured = (
            f"captures boundaries {describe_boundaries(r.boundaries, num_layers)}"
            if r.boundaries is not None
            else f"cannot capture them: {r.problem}"
        )
        matches = (
            r.boundaries is not None
            and r.problem is None
            and (trained.boundaries is None or tuple(r.boundaries) == trained.boundaries)
        )
        result.rows.append(Row(item=f"{r.label}: {key}", declared=shown, actual=captured, ok=matches))
        details = _by_values(r, trained, num_layers, result)
        if matches and not details[1]:
            continue
        result.findings.append(
            _ids_finding(r, engine, key, cfg_path, num_layers, architecture, trained, fix, details[0])
        )
    return readings


def _by_values(
    r: ServedReading, trained: Trained, num_layers: int, result: CheckResult
) -> tuple[tuple[str, ...], bool]:
    """Rows comparing each state the engine captures with the trained state's fingerprint; (details, any bad)."""
    if trained.states is None or r.boundaries is None or not trained.fingerprint_aux:
        return (), False
    lines, bad = [], False
    for i, b in enumerate(r.boundaries):
        if i >= len(trained.fingerprint_aux) or StateKey(b) not in trained.states:
            lines.append(f"column {i}: boundary {b}: no trained aux state to compare with")
            bad = True
            continue
        d = distance(trained.fingerprint_aux[i], *summarize(trained.states[StateKey(b)]))
        ok = d <= trained.tolerance
        bad = bad or not ok
        assert trained.boundaries is not None
        result.rows.append(
            Row(
                item=f"{r.label}: column {i} by values",
                declared=f"the trained aux[{i}] (boundary {trained.boundaries[i]})",
                actual=f"boundary {b} on the probe",
                ok=ok,
                note=f"distance {d:.1e}, tolerance {trained.tolerance:.0e}",
            )
        )
        lines.append(
            f"column {i}: the engine's boundary {b} is at distance {d:.1e} from the trained aux[{i}] values "
            f"({'the same state' if ok else 'another state'}; tolerance {trained.tolerance:.0e})"
        )
    if len(r.boundaries) < len(trained.fingerprint_aux):
        bad = True
    return tuple(lines), bad


def _ids_finding(
    r: ServedReading,
    engine: str,
    key: str,
    cfg_path: Path,
    num_layers: int,
    architecture: str,
    trained: Trained,
    fix: str,
    details: tuple[str, ...],
) -> Finding:
    shown = fmt_list(r.ids) if r.ids is not None else "absent (the engine's defaults)"
    trained_txt = (
        f"trained on boundaries {describe_boundaries(trained.boundaries, num_layers)} ({trained.source})"
        if trained.boundaries is not None
        else "trained on boundaries nobody states (no contract.json, no --data)"
    )
    if r.boundaries is None:
        return Finding(
            check=f"export.{engine}.layer_ids",
            severity="error",
            what=f"{r.label} cannot capture {key} = {shown}: valid are {_id_range(engine, architecture, num_layers)}, "
            "each at most once",
            declared=f"{cfg_path}: {key} = {shown}",
            actual=f"{r.problem}; the draft was {trained_txt}",
            fix=fix,
        )
    what = (
        f"{r.label} will feed the draft other states than it was trained on: "
        + diagnose_aux(
            trained.boundaries, list(r.boundaries), declared_name="training", actual_name="the engine"
        )
        if trained.boundaries is not None and tuple(r.boundaries) != trained.boundaries
        else f"{r.label}: {r.problem}"
        if r.problem
        else f"{r.label} captures states whose values are not the ones the draft was trained on"
    )
    if r.problem and trained.boundaries is not None and tuple(r.boundaries) != trained.boundaries:
        what += f"; and {r.problem}"
    return Finding(
        check=f"export.{engine}.layer_ids",
        severity="error",
        what=what,
        declared=f"{cfg_path}: {key} = {shown} -> {r.label} captures boundaries "
        f"{describe_boundaries(r.boundaries, num_layers)}",
        actual=f"the draft was {trained_txt}",
        fix=fix,
        details=details,
    )
