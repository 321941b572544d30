"""`eaglewire export`: write a draft directory SGLang or vLLM loads as is, plus a launch command.

Writes config.json (the engine's layout), model.safetensors (the engine's tensor names),
contract.json (copied), export.json (what was decided and why), launch_<engine>.sh and the marker
eaglewire.json (kind export-<engine>, each file's size and sha256), all at once: the directory is
built beside --out and renamed into place, replacing only an earlier export of the same engine,
with --force (eaglewire.outputs).

The layer ids come from the engine table (`eaglewire.contract.numbering.engine_ids`): for the
release named with --sglang-version / --vllm-version, or ids every release read reads alike for
the target's architecture. Boundaries the engine cannot capture (SGLang: boundary L; some
releases and architectures: boundary 0; both: out of layer order) are refused with the rule
cited and the alternatives. The target is named by an absolute path or a hub id (`launch.
resolve_target_reference`), so the export loads from any working directory. Formats checked
against sglang 0.5.10-0.5.23 (id rules), vllm 0.33.0 and speculators 0.9.0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from safetensors.torch import save_file

from eaglewire.contract.contract import CONTRACT_FILE, Contract
from eaglewire.contract.numbering import describe_boundary
from eaglewire.draft.io import WEIGHTS_FILE, load_draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.export.keys import ENGINE_NUM_AUX
from eaglewire.export.launch import (
    LAUNCH_FILES,
    render,
    resolve_spec_args,
    resolve_target_reference,
    sglang_command,
    vllm_command,
    vllm_speculative_tokens,
    write_launch_script,
)
from eaglewire.export.layout import engine_tensors
from eaglewire.export.sglang import sglang_config, sglang_layer_ids
from eaglewire.export.vllm import speculators_config, vllm_layer_ids
from eaglewire.export.vocab_map import is_identity
from eaglewire.io_utils import atomic_write_json
from eaglewire.output_marker import OutputKind, write_marker
from eaglewire.outputs import check_output_dir, fresh_output
from eaglewire.target.loading import torch_dtype
from eaglewire.tensor_checks import check_finite

log = logging.getLogger(__name__)

ExportFormat = Literal["sglang", "vllm"]
EXPORT_MANIFEST = "export.json"
# What the engine does with the files that a reader of export.json should know.
ENGINE_NOTES: dict[str, list[str]] = {
    "sglang": [
        "SGLang replaces embed_tokens by the target's embedding when target_hidden_size == hidden_size",
        "d2t holds offsets: target id = draft id + d2t[draft id]; t2d is not read by SGLang",
    ],
    "vllm": [
        "vLLM uses embed_tokens from this file; without one it shares the target's",
        "norm_before_residual is written as false on purpose: vLLM reads an absent key as true",
        "vLLM reads speculators_config.verifier only when this directory is served alone, and then takes only a "
        "hub id (vllm 0.33.0 transformers_utils/config.py:859-874): launch_vllm.sh names the target itself",
    ],
}
CONFIG_FILE = "config.json"
EXPORT_KINDS = {"sglang": OutputKind.EXPORT_SGLANG, "vllm": OutputKind.EXPORT_VLLM}


def export_files(fmt: str) -> tuple[str, ...]:
    """The files an export of `fmt` holds (its marker lists their sizes and sha256)."""
    return (CONFIG_FILE, WEIGHTS_FILE, CONTRACT_FILE, EXPORT_MANIFEST, LAUNCH_FILES[fmt])


@dataclass(frozen=True)
class ExportResult:
    out: Path
    format: ExportFormat
    layer_ids: tuple[int, ...]  # as written in config.json
    numbering: str  # what the ids mean, and which engine releases read them so
    boundaries: tuple[int, ...]
    readings: tuple[str, ...]  # each engine release range's reading of the ids
    verifier: str  # the target as the export names it (absolute path or hub id)
    spec: SpecArgs
    spec_source: str
    launch_command: str
    launch_file: Path
    tensor_names: tuple[str, ...]


def _check_servable(contract: Contract, draft_dir: Path) -> None:
    if contract.num_aux != ENGINE_NUM_AUX:
        raise ConfigError(
            f"{draft_dir}: the draft reads {contract.num_aux} aux states (aux_boundaries={list(contract.aux_boundaries)}) "
            f"but exports are served with fc built for exactly {ENGINE_NUM_AUX} (target_hidden_size * {ENGINE_NUM_AUX}: "
            "vllm 0.33.0 for any speculators config, sglang 0.5.10-0.5.11 for any draft)",
            fix=f"train a draft with {ENGINE_NUM_AUX} aux boundaries, e.g. the defaults (eaglewire draft init without "
            "--aux-boundaries)",
        )


def export_draft(
    draft_dir: Path,
    fmt: ExportFormat,
    out: Path,
    *,
    sglang_version: str | None = None,
    vllm_version: str | None = None,
    verifier: str | None = None,
    best_setting: Path | None = None,
    num_steps: int | None = None,
    topk: int | None = None,
    num_draft_tokens: int | None = None,
    target_path: str | None = None,
    dtype: str | None = None,
    force: bool = False,
) -> ExportResult:
    """Export the eaglewire draft in `draft_dir` to `out` in `fmt`. `dtype` defaults to the contract's.

    `out` must be missing, empty, or (with `force`) an earlier export of the same format, which is
    replaced whole: the export is built in a sibling temporary directory and renamed into place
    (`outputs.fresh_output`), so no stale file of an earlier export survives and a failure changes
    nothing. Checked before the draft is loaded."""
    draft_dir, out = Path(draft_dir), Path(out)
    if fmt not in LAUNCH_FILES:
        raise ConfigError(f"--format: expected one of {sorted(LAUNCH_FILES)}, got {fmt!r}")
    for flag, value, applies in (
        ("--sglang-version", sglang_version, "sglang"),
        ("--vllm-version", vllm_version, "vllm"),
        ("--verifier", verifier, "vllm"),
    ):
        if value is not None and fmt != applies:
            raise ConfigError(
                f"{flag} {value} given with --format {fmt}: it only applies to --format {applies}",
                fix=f"drop {flag}, or export with --format {applies}",
            )
    if out.resolve() == draft_dir.resolve():
        raise ConfigError(
            f"--out {out} is the draft directory itself", fix="pick a new directory for the export"
        )
    kind = EXPORT_KINDS[fmt]
    check_output_dir(out, kind, force=force)  # before any work
    model, contract = load_draft(draft_dir)
    _check_servable(contract, draft_dir)
    cfg = model.config
    dtype_name = dtype or contract.dtype
    spec, spec_source = resolve_spec_args(
        draft_dir=draft_dir,
        best_setting=best_setting,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
    )
    target = resolve_target_reference(
        target_path=target_path, recorded=contract.target.name, verifier=verifier, fmt=fmt
    )
    state = model.state_dict()
    mapped = not is_identity(state["draft_to_target"], cfg.vocab_size)
    if fmt == "sglang":
        written = sglang_layer_ids(contract, sglang_version)
        ids = written.ids
        config: dict[str, Any] = sglang_config(cfg, ids, dtype=dtype_name)
        # SGLang reads d2t/t2d whenever present; an identity map is harmless, so always write it.
        tensors = engine_tensors(
            state, "sglang", dtype=torch_dtype(dtype_name), with_vocab_map=True, vocab_size=cfg.vocab_size
        )
        argv = sglang_command(target.launch, out.resolve(), spec, dtype=dtype_name)
    else:
        written = vllm_layer_ids(contract, vllm_version)
        ids = written.ids
        config = speculators_config(
            cfg,
            ids,
            dtype=dtype_name,
            speculative_tokens=vllm_speculative_tokens(spec),
            verifier_name_or_path=target.verifier,
            verifier_architecture=contract.target.architecture,
        )
        # speculators carries d2t/t2d only when Vd != V; vLLM then defaults to the identity.
        tensors = engine_tensors(
            state, "vllm", dtype=torch_dtype(dtype_name), with_vocab_map=mapped, vocab_size=cfg.vocab_size
        )
        argv = vllm_command(target.launch, out.resolve(), spec, dtype=dtype_name)

    # the draft's weights were checked when loaded; a cast to a narrower --dtype can still overflow to inf
    check_finite(
        tensors,
        where=f"{draft_dir} exported as {fmt} in {dtype_name}",
        fix="export in a wider dtype: --dtype bfloat16 (float16's range ends at 65504) or --dtype float32",
    )
    L = contract.target.num_layers
    numbering = written.numbering
    readings = tuple(r.text() for r in written.readings)
    comments = [
        f"eaglewire export --format {fmt} of {draft_dir.resolve()}",
        f"target: {contract.target.architecture}, L={L}, at {target.launch}",
        f"aux boundaries {list(contract.aux_boundaries)} written as ids {list(ids)}: {numbering}",
        *(f"  boundary {b}: {describe_boundary(b, L)}" for b in contract.aux_boundaries),
        *(f"  {r}" for r in readings),
        f"speculative arguments from: {spec_source}",
    ]
    manifest = {
        "format": fmt,
        "source_draft": str(draft_dir.resolve()),
        "layer_ids": list(ids),
        "numbering": numbering,
        "engine_version": None if written.version is None else str(written.version),
        "read_as": list(readings),
        "target": {"path": target.launch, "verifier": target.verifier, "from": target.source},
        "aux_boundaries": list(contract.aux_boundaries),
        "speculative": {
            "num_steps": spec.num_steps,
            "topk": spec.topk,
            "num_draft_tokens": spec.num_draft_tokens,
        },
        "speculative_source": spec_source,
        "dtype": dtype_name,
        "vocab_map": "identity" if not mapped else f"{cfg.draft_vocab_size} of {cfg.vocab_size} target ids",
        "launch_command": render(argv),
        "notes": ENGINE_NOTES[fmt],
    }
    with fresh_output(out, kind, force=force) as tmp:
        atomic_write_json(tmp / CONFIG_FILE, config)
        save_file(
            tensors,
            str(tmp / WEIGHTS_FILE),
            metadata={"format": "pt", "producer": "eaglewire", "layout": fmt},
        )
        contract.save(tmp)
        write_launch_script(tmp / LAUNCH_FILES[fmt], argv, comments)
        atomic_write_json(tmp / EXPORT_MANIFEST, manifest)
        write_marker(tmp, kind, export_files(fmt))
    launch_file = out / LAUNCH_FILES[fmt]
    log.info("exported %s draft to %s (%d tensors)", fmt, out, len(tensors))
    return ExportResult(
        out=out,
        format=fmt,
        layer_ids=tuple(ids),
        numbering=numbering,
        boundaries=contract.aux_boundaries,
        readings=readings,
        verifier=target.verifier,
        spec=spec,
        spec_source=spec_source,
        launch_command=render(argv),
        launch_file=launch_file,
        tensor_names=tuple(sorted(tensors)),
    )
