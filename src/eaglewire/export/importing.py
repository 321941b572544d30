"""`eaglewire import`: an SGLang, vLLM/speculators or EAGLE-official draft -> an eaglewire draft with a contract.

The ids' numbering comes from the format (vLLM/speculators: boundaries; EAGLE: hard-coded
defaults), is stated by the user (`numbering=`), or for SGLang from the engine table for the
target's architecture: the release named with `sglang_version`, the one our own export.json
records, or, with none, every release read when they all read the ids alike (else refused with
each release's reading). The new contract is built on the live target (identity hashes +
fingerprint). Only safetensors are read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eaglewire.contract.contract import CONTRACT_FILE, Contract, require_same_wiring
from eaglewire.contract.numbering import (
    ENGINE_RULES,
    Engine,
    EngineRule,
    Numbering,
    engine_rules,
    parse_numbering,
    to_boundaries,
)
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.io import save_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import BoundaryError, CheckpointError, ConfigError, expected_actual
from eaglewire.export.eagle import read_eagle
from eaglewire.export.engine_config import ForeignDraft
from eaglewire.export.exporting import CONFIG_FILE, EXPORT_MANIFEST
from eaglewire.export.keys import (
    D2T,
    EAGLEWIRE_VOCAB_BUFFER,
    EMBED,
    FORMATS,
    IGNORED_ON_IMPORT,
    LAYER_PREFIX,
    SGLANG_OPTIONAL_PREFIX,
    T2D,
    EngineFormat,
    required_tensors,
)
from eaglewire.export.layout import engine_to_eaglewire_names, read_weights
from eaglewire.export.sglang import read_sglang
from eaglewire.export.vllm import read_speculators
from eaglewire.export.vocab_map import offsets_to_absolute
from eaglewire.output_marker import OutputKind
from eaglewire.outputs import check_output_dir, fresh_output
from eaglewire.target.architectures import target_parts
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from eaglewire.tensor_checks import check_finite
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)

READERS = {"sglang": read_sglang, "vllm": read_speculators, "eagle": read_eagle}


@dataclass(frozen=True)
class ImportResult:
    out: Path
    format: EngineFormat
    layer_ids: tuple[int, ...] | None  # as written in the source (None: the engine's defaults)
    boundaries: tuple[int, ...]
    numbering: str
    numbering_from: str  # "format" | "stated" | "--sglang-version" | "export.json" | "inferred (...)"
    contract: Contract
    notes: tuple[str, ...]


def _manifest_version(src: Path, ids: tuple[int, ...]) -> str | None:
    """The SGLang release our own export.json says its ids were written for (when they are still its ids)."""
    path = src / EXPORT_MANIFEST
    if not path.exists():
        return None
    manifest = read_json_file(path)
    if not isinstance(manifest, dict) or manifest.get("layer_ids") != list(ids):
        return None
    version = manifest.get("engine_version")
    return version if isinstance(version, str) else None


def _read_by(rule: EngineRule, ids: tuple[int, ...], L: int) -> tuple[int, ...] | str:
    assert rule.numbering is not None
    try:
        return to_boundaries(ids, rule.numbering, L)
    except BoundaryError as e:
        return str(e).splitlines()[0]


def resolve_boundaries(
    foreign: ForeignDraft,
    num_layers: int,
    *,
    stated: str | None,
    src: Path,
    architecture: str | None = None,
    sglang_version: str | None = None,
) -> tuple[tuple[int, ...], str, str]:
    """(boundaries, numbering name, where the numbering came from).

    SGLang ids without a stated rule are read with the engine table: the release named (or recorded
    in our export.json) for `architecture`, else every release read, which must agree. Without an
    architecture every SGLang row of every architecture must agree."""
    ids, L = foreign.layer_ids, num_layers
    if stated is not None:
        numbering = parse_numbering(stated)
        if foreign.fmt == "eagle" and numbering is not Numbering.EAGLE:
            raise ConfigError(
                f"--numbering {stated} with --format eagle: EAGLE's code takes no ids (numbering 'eagle')"
            )
        if foreign.format_numbering is not None and numbering is not foreign.format_numbering:
            log.warning(
                "the %s format means %s; using the stated %s",
                foreign.fmt,
                foreign.format_numbering.value,
                stated,
            )
        return to_boundaries(ids, numbering, L), numbering.value, "stated"
    if foreign.format_numbering is not None:
        return to_boundaries(ids, foreign.format_numbering, L), foreign.format_numbering.value, "format"
    if ids is None:  # SGLang without ids captures its defaults [2, L//2, L-3] in every release read
        return to_boundaries(None, Numbering.LAYER_OUTPUT, L), "sglang (no ids: engine defaults)", "format"
    version, how = sglang_version, "--sglang-version"
    if version is None:
        version, how = _manifest_version(src, ids), EXPORT_MANIFEST
    if architecture is None and (src / CONTRACT_FILE).exists():
        architecture = Contract.load(src).target.architecture  # the export's own target (identity only)
    if architecture is None:
        if version is not None:
            raise BoundaryError(
                f"SGLang ids {list(ids)} with SGLang {version}: the target's architecture is needed to know the "
                "release's id rule"
            )
        rules = [r for r in ENGINE_RULES if r.engine is Engine.SGLANG and r.numbering is not None]
        architecture = "any"
    else:
        rules = [r for r in engine_rules(Engine.SGLANG, architecture, version) if r.numbering is not None]
    readings = {f"{r.label} ({', '.join(sorted(r.families))})": _read_by(r, ids, L) for r in rules}
    if version is not None:
        rule = rules[0]
        got = _read_by(rule, ids, L)
        if isinstance(got, str):
            raise BoundaryError(f"SGLang ids {list(ids)} ({rule.label}, {architecture}): {got}")
        return got, f"{rule.numbering} ({rule.label})", how
    distinct = set(readings.values())
    if len(distinct) == 1 and not isinstance(got := next(iter(distinct)), str):
        return got, f"sglang (every release read for {architecture} agrees)", "inferred (unambiguous)"
    shown = "; ".join(
        f"{label} reads {list(value) if isinstance(value, tuple) else value}"
        for label, value in readings.items()
    )
    raise BoundaryError(
        f"SGLang ids {list(ids)} on a {architecture} target (L={L}): the releases eaglewire has read disagree: "
        f"{shown}",
        fix="name the release the draft was served with (--sglang-version), or the rule its ids follow "
        "(--numbering layer-output or --numbering pr25454)",
    )


def _normalise_names(
    tensors: dict[str, torch.Tensor], fmt: EngineFormat, where: str
) -> dict[str, torch.Tensor]:
    """Names as the engine's loader resolves them (SGLang strips `model.`, vLLM renames `midlayer.`)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        new = name
        if name.startswith(SGLANG_OPTIONAL_PREFIX):
            if fmt == "vllm":
                raise CheckpointError(
                    f"{where}: tensor {name!r}: vLLM's loader adds the 'model.' prefix itself and would not find it",
                    fix="save the tensors without the 'model.' prefix",
                )
            new = name[len(SGLANG_OPTIONAL_PREFIX) :]
        if fmt == "vllm" and new.startswith(LAYER_PREFIX["sglang"]):
            new = LAYER_PREFIX["vllm"] + new[len(LAYER_PREFIX["sglang"]) :]
        if new in out:
            raise CheckpointError(f"{where}: tensor {new!r} given twice (with and without a prefix)")
        out[new] = t
    return out


def engine_state_dict(
    tensors: dict[str, torch.Tensor], fmt: EngineFormat, model: Eagle3Draft, target: LoadedTarget, where: str
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Map and check engine tensors against `model`'s shapes; every problem is named in one error."""
    tensors = _normalise_names(tensors, fmt, where)
    expected = model.state_dict()
    names = engine_to_eaglewire_names(fmt)
    cfg = model.config
    problems, notes = [], []
    missing = sorted(required_tensors(fmt) - set(tensors))
    for name in missing:
        problems.append(f"tensor {name!r} missing (expected shape {tuple(expected[names[name]].shape)})")
    unknown = sorted(set(tensors) - set(names) - {D2T, T2D} - IGNORED_ON_IMPORT)
    if unknown:
        problems.append(
            f"unexpected tensors {unknown} (no eaglewire parameter; a second layer or another variant?)"
        )
    state: dict[str, torch.Tensor] = {}
    for foreign, ours in names.items():
        if foreign not in tensors:
            continue
        want, got = tuple(expected[ours].shape), tuple(tensors[foreign].shape)
        if want != got:
            why = (
                f" = [H, A*Ht] = [{cfg.hidden_size}, {cfg.num_aux}*{cfg.target_hidden_size}]"
                if ours == "fc.weight"
                else ""
            )
            problems.append(f"tensor {foreign!r}: expected shape {want}{why}, got {got}")
        state[ours] = tensors[foreign].float()
    if EMBED not in tensors:
        if cfg.hidden_size != target.hidden_size:
            problems.append(
                f"tensor {EMBED!r} missing and draft hidden {cfg.hidden_size} != target hidden {target.hidden_size}"
            )
        else:
            state[EMBED] = target_parts(target.model).embed_tokens.weight.detach().float().cpu().clone()
            notes.append(f"{EMBED} absent: copied from the target (what the engines do)")
    if problems:
        raise CheckpointError(
            f"{where}: tensors do not fit the draft config.json describes:\n  " + "\n  ".join(problems)
        )
    state[EAGLEWIRE_VOCAB_BUFFER] = offsets_to_absolute(
        tensors.get(D2T),
        tensors.get(T2D),
        vocab_size=cfg.vocab_size,
        draft_vocab_size=cfg.draft_vocab_size,
        where=where,
    )
    return state, notes


def _check_against_target(layer: dict[str, Any], target: LoadedTarget, where: str) -> None:
    problems = []
    if layer["vocab_size"] != target.vocab_size:
        problems.append(
            expected_actual("vocab_size (the target's V)", target.vocab_size, layer["vocab_size"])
        )
    if layer["target_hidden_size"] != target.hidden_size:
        problems.append(
            expected_actual(
                "target_hidden_size (the target's Ht)", target.hidden_size, layer["target_hidden_size"]
            )
        )
    if problems:
        raise ConfigError(
            f"{where}: the draft was not built for this target ({target.architecture} at {target.path}):\n  "
            + "\n  ".join(problems),
            fix="pass the target the draft was trained for (--target)",
        )


def import_draft(
    fmt: EngineFormat,
    src: Path,
    target: LoadedTarget,
    out: Path,
    *,
    numbering: str | None = None,
    sglang_version: str | None = None,
    force: bool = False,
) -> ImportResult:
    """Read an engine-format draft from `src`, check it against `target`, save an eaglewire draft to `out`.

    `out` must be missing, empty, or (with `force`) an earlier eaglewire draft, replaced whole (built
    in a sibling temporary directory, then renamed: `outputs.fresh_output`)."""
    src, out = Path(src), Path(out)
    if fmt not in FORMATS:
        raise ConfigError(f"--format: expected one of {list(FORMATS)}, got {fmt!r}")
    if out.exists() and out.resolve() == src.resolve():
        raise ConfigError(f"--out {out} is the source directory", fix="pick a new directory")
    if sglang_version is not None and fmt != "sglang":
        raise ConfigError(
            f"--sglang-version {sglang_version} given with --format {fmt}: it only applies to --format sglang",
            fix="drop --sglang-version",
        )
    check_output_dir(out, OutputKind.DRAFT, force=force)  # before reading anything
    cfg_path = src / CONFIG_FILE
    config = read_json_file(cfg_path)
    if not isinstance(config, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object")
    foreign = READERS[fmt](config, str(cfg_path))
    _check_against_target(foreign.layer, target, str(cfg_path))
    tensors = read_weights(src)  # every safetensors header checked: a cut file names its tensor
    boundaries, numbering_name, how = resolve_boundaries(
        foreign,
        target.num_layers,
        stated=numbering,
        src=src,
        architecture=target.architecture,
        sglang_version=sglang_version,
    )
    provenance = {
        "imported_from": str(src.resolve()),
        "format": fmt,
        "layer_ids": None if foreign.layer_ids is None else list(foreign.layer_ids),
        "numbering": numbering_name,
        "numbering_from": how,
    }
    draft_cfg = DraftConfig(**foreign.layer, num_aux=len(boundaries), extra=provenance)
    model = Eagle3Draft(draft_cfg)
    state, notes = engine_state_dict(tensors, fmt, model, target, str(src))
    check_finite(
        state,
        where=f"{src} (eaglewire names)",
        fix="import a checkpoint whose weights are finite (an earlier one, or the trainer's original)",
    )
    model.load_state_dict(state)
    contract = build_contract(target, boundaries)
    if (src / CONTRACT_FILE).exists():
        require_same_wiring(
            Contract.load(src),
            contract,
            names=(f"{src / CONTRACT_FILE}", "the imported draft on this target"),
        )
    with fresh_output(out, OutputKind.DRAFT, force=force) as tmp:
        save_draft(model, contract, tmp)
    all_notes = (*foreign.notes, *notes)
    for n in all_notes:
        log.info("%s", n)
    log.info(
        "imported %s draft from %s: boundaries %s (%s, from %s)",
        fmt,
        src,
        list(boundaries),
        numbering_name,
        how,
    )
    return ImportResult(
        out=out,
        format=fmt,
        layer_ids=foreign.layer_ids,
        boundaries=boundaries,
        numbering=numbering_name,
        numbering_from=how,
        contract=contract,
        notes=all_notes,
    )
