"""Lint SGLang server arguments and the draft config the way SGLang reads them.

Server arguments: the three speculative knobs go through `eaglewire.engine.spec_args.
sglang_effective_spec_args` (SGLang's rewrite rules in one place: the topk=1 rewrite of
num_draft_tokens, auto-chosen values, refused combinations). The rules below it are also
SGLang's (`_handle_eagle_family` in sgl-project/sglang python/sglang/srt/server_args.py and, in
newer releases, python/sglang/srt/arg_groups/speculative_hook.py; re-check on a version change):

- `--speculative-algorithm NEXTN` is EAGLE; EAGLE (not EAGLE3) captures no aux states.
- topk > 1 with any `trtllm_mha` attention backend is refused.
- topk > 1 with `--page-size` > 1 is refused unless the attention backend implements paged trees:
  flashinfer, fa3, triton in current releases (older releases: flashinfer only).

Layer ids: SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids`. What an id means depends on
the release *and* the target architecture (`eaglewire.contract.numbering.ENGINE_RULES`, read from
sglang 0.5.10-0.5.23): Llama, Mistral, Qwen2/3 and Qwen3-MoE targets read every id as "output of
layer id"; DeepSeek-V2/V3 and GLM-4-MoE-Lite targets do so only when the first id is 1 from 0.5.13
on (PR #25454). No release captures boundary L; boundary 0 (the field reports' `-1`) only some
releases per architecture. No ids: SGLang captures boundaries [2, L//2, L-3]. Without
--sglang-version every release read is checked and releases that read the ids apart are a finding.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from eaglewire.contract.numbering import (
    Engine,
    EngineReading,
    engine_ids,
    engine_readings,
)
from eaglewire.doctor.draft_source import DraftSource
from eaglewire.doctor.findings import CheckResult, Finding, Row, fmt_list
from eaglewire.doctor.serving_common import (
    ServedReading,
    ServingLint,
    compare_reading,
    loadable_draft_source,
    reading_row,
    same_directory,
    served_reading,
)
from eaglewire.engine.spec_args import FLAG, sglang_effective_spec_args
from eaglewire.errors import BoundaryError, ConfigError

CHECK = "serving: sglang"
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
PAGE_TREE_BACKENDS_OLD = ("flashinfer",)
# flag -> field; argparse also accepts these abbreviations, seen in real launch commands.
VALUE_FLAGS = {
    "--speculative-algorithm": "algorithm",
    "--speculative-algo": "algorithm",
    "--speculative-draft-model-path": "draft_model_path",
    "--speculative-draft-model": "draft_model_path",
    "--speculative-draft": "draft_model_path",
    "--speculative-num-steps": "num_steps",
    "--speculative-eagle-topk": "topk",
    "--speculative-num-draft-tokens": "num_draft_tokens",
    "--page-size": "page_size",
    "--attention-backend": "attention_backend",
    "--decode-attention-backend": "decode_attention_backend",
    "--prefill-attention-backend": "prefill_attention_backend",
    "--model-path": "model_path",
    "--model": "model_path",
}
INT_FIELDS = ("num_steps", "topk", "num_draft_tokens", "page_size")


@dataclass(frozen=True)
class SGLangArgs:
    algorithm: str | None = None
    draft_model_path: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    page_size: int | None = None
    attention_backend: str | None = None
    decode_attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    model_path: str | None = None
    other_speculative: tuple[str, ...] = field(default=())  # --speculative-* flags not linted here


def parse_sglang_args(text: str) -> SGLangArgs:
    """'--speculative-algorithm EAGLE3 --speculative-num-steps 1 ...' -> SGLangArgs (other flags ignored)."""
    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"--sglang-args: cannot split {text!r} like a shell would ({e})") from None
    values: dict[str, object] = {}
    other: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name, eq, inline = tok.partition("=")
        if name in VALUE_FLAGS:
            if eq:
                raw = inline
            elif i + 1 < len(tokens):
                raw = tokens[i + 1]
                i += 1
            else:
                raise ConfigError(f"--sglang-args: {name} has no value")
            key = VALUE_FLAGS[name]
            if key in INT_FIELDS:
                try:
                    values[key] = int(raw)
                except ValueError:
                    raise ConfigError(f"--sglang-args: {name} expects an integer, got {raw!r}") from None
            else:
                values[key] = raw
        elif name.startswith("--speculative-"):
            other.append(name)
        i += 1
    return SGLangArgs(**values, other_speculative=tuple(other))  # type: ignore[arg-type]


def _spec_rows_and_findings(args: SGLangArgs, architecture: str | None, result: CheckResult) -> None:
    algo = (args.algorithm or "").upper()
    if algo == "NEXTN":
        algo = "EAGLE"
    result.rows.append(
        Row(
            item="--speculative-algorithm",
            declared=str(args.algorithm),
            actual=algo or "none",
            ok=algo == "EAGLE3",
        )
    )
    if algo != "EAGLE3":
        result.findings.append(
            Finding(
                check="serving.sglang.algorithm",
                severity="error",
                what="speculative decoding is off"
                if not algo
                else f"{algo} runs the draft without EAGLE-3's aux states",
                declared=f"--speculative-algorithm {args.algorithm}",
                actual="no speculation"
                if not algo
                else f"{algo}: the draft's fc gets no A*Ht-wide aux input",
                fix="--speculative-algorithm EAGLE3",
            )
        )
    try:
        effective, rewrites = sglang_effective_spec_args(
            args.num_steps, args.topk, args.num_draft_tokens, architecture=architecture
        )
    except ConfigError as e:
        result.findings.append(
            Finding(
                check="serving.sglang.spec_args",
                severity="error",
                what="SGLang refuses these speculative arguments",
                declared=f"{FLAG['num_steps']} {args.num_steps} {FLAG['topk']} {args.topk} {FLAG['num_draft_tokens']} {args.num_draft_tokens}",
                actual=str(e).split("\n  fix:")[0],
                fix=e.fix or "pass a consistent set of the three flags",
            )
        )
        return
    by_field = {r.field: r for r in rewrites}
    for name in ("num_steps", "topk", "num_draft_tokens"):
        requested = getattr(args, name)
        value = getattr(effective, name)
        rw = by_field.get(name)
        result.rows.append(
            Row(
                item=FLAG[name],
                declared="not passed" if requested is None else str(requested),
                actual=str(value),
                ok=rw is None or requested is None,
                note=rw.reason if rw else "",
            )
        )
    for rw in rewrites:
        if rw.requested is None:
            result.notes.append(rw.explain())
            continue
        chain = effective.topk == 1 and rw.field == "num_draft_tokens" and rw.requested >= 2
        fix = (
            f"{FLAG['num_steps']} {rw.requested - 1} {FLAG['topk']} 1 {FLAG['num_draft_tokens']} {rw.requested} "
            f"(a chain of {rw.requested - 1} draft tokens), or state what runs: {FLAG['num_draft_tokens']} {rw.effective}"
            if chain
            else f"{FLAG[rw.field]} {rw.effective}"
        )
        result.findings.append(
            Finding(
                check=f"serving.sglang.{rw.field}",
                severity="error",
                what=f"SGLang silently rewrites {FLAG[rw.field]} {rw.requested} to {rw.effective}",
                declared=f"{FLAG[rw.field]} {rw.requested}",
                actual=f"{rw.effective}: {rw.reason} (only a log line says so)",
                fix=fix,
            )
        )
    _backend_findings(args, effective.topk, result)


def _backend_findings(args: SGLangArgs, topk: int, result: CheckResult) -> None:
    if topk <= 1:
        return
    backends = [
        b
        for b in (args.attention_backend, args.decode_attention_backend, args.prefill_attention_backend)
        if b
    ]
    if "trtllm_mha" in backends:
        result.findings.append(
            Finding(
                check="serving.sglang.attention_backend",
                severity="error",
                what="SGLang refuses topk > 1 with the trtllm_mha attention backend",
                declared=f"{FLAG['topk']} {topk}, attention backends {backends}",
                actual="startup error: trtllm_mha only supports topk = 1",
                fix=f"{FLAG['topk']} 1, or --attention-backend flashinfer",
            )
        )
    page = args.page_size or 1
    if page > 1:
        backend = args.attention_backend
        if backend is None:
            result.findings.append(
                Finding(
                    check="serving.sglang.page_size",
                    severity="warning",
                    what="topk > 1 with --page-size > 1 depends on the auto-selected attention backend",
                    declared=f"{FLAG['topk']} {topk} --page-size {page}, no --attention-backend",
                    actual=f"SGLang refuses unless the backend is one of {list(PAGE_TREE_BACKENDS)}",
                    fix="--attention-backend flashinfer (or --page-size 1)",
                )
            )
        elif backend not in PAGE_TREE_BACKENDS:
            result.findings.append(
                Finding(
                    check="serving.sglang.page_size",
                    severity="error",
                    what="SGLang refuses topk > 1 with --page-size > 1 on this attention backend",
                    declared=f"{FLAG['topk']} {topk} --page-size {page} --attention-backend {backend}",
                    actual=f"startup error: only {list(PAGE_TREE_BACKENDS)} implement paged draft trees",
                    fix="--page-size 1 (or --attention-backend flashinfer)",
                )
            )
        elif backend not in PAGE_TREE_BACKENDS_OLD:
            result.notes.append(
                f"topk > 1 with --page-size {page} on {backend}: accepted by current SGLang; older releases "
                "accept only flashinfer"
            )


def sglang_readings(
    ids: Sequence[int] | None,
    num_layers: int,
    trained: Sequence[int] | None,
    version: str | None,
    architecture: str,
) -> list[ServedReading]:
    """How the named SGLang release (or each release range read) reads `ids` (None: SGLang's defaults).

    Consecutive release ranges that read the ids alike are one reading ("SGLang 0.5.13-0.5.23")."""
    table = engine_readings(Engine.SGLANG, architecture, ids, num_layers, version)
    if version is not None:
        (r,) = table
        fix = _ids_fix(trained, architecture, num_layers, version)
        return [replace(served_reading(r, fix), label=f"SGLang {version} ({r.rule.versions} read)")]
    groups: list[list[EngineReading]] = []
    for r in table:
        if groups and (groups[-1][-1].boundaries, groups[-1][-1].problem) == (r.boundaries, r.problem):
            groups[-1].append(r)
        else:
            groups.append([r])
    out = []
    for group in groups:
        first, last = group[0].rule, group[-1].rule
        label = f"SGLang {first.first}" + (f"-{last.last}" if last.last != first.first else "")
        if len(groups) == 1:
            label += " (every release read)"
        fix = _ids_fix(trained, architecture, num_layers, None if len(groups) == 1 else str(last.last))
        out.append(replace(served_reading(group[-1], fix), label=label))
    return out


def _ids_fix(trained: Sequence[int] | None, architecture: str, num_layers: int, version: str | None) -> str:
    if trained is None:
        return "set eagle_config.eagle_aux_hidden_state_layer_ids for the boundaries the draft was trained on (see `eaglewire ids`)"
    try:
        ids = engine_ids(Engine.SGLANG, architecture, trained, num_layers, version).ids
    except BoundaryError as e:
        return f"no SGLang ids serve it: {str(e).splitlines()[0]}" + (f" ({e.fix})" if e.fix else "")
    return f'set "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {fmt_list(ids)}}} in the draft\'s config.json'


def lint_sglang(
    args_text: str,
    *,
    draft: DraftSource | None,
    num_layers: int | None,
    trained: Sequence[int] | None,
    trained_from: str = "the draft's contract",
    version: str | None = None,
    architecture: str | None = None,
    ids_checked: Path | None = None,
) -> ServingLint:
    """Lint `--sglang-args` and the draft config SGLang would load. `trained`: the boundaries the draft needs.

    ids_checked: an export whose layer ids the export check already compared; when SGLang loads that
    directory its readings are returned (for the standalone check) without repeating the findings."""
    result = CheckResult(name=CHECK)
    args = parse_sglang_args(args_text)
    _spec_rows_and_findings(args, architecture, result)
    if args.other_speculative:
        result.notes.append(f"not linted: {', '.join(sorted(set(args.other_speculative)))}")
    source = loadable_draft_source(
        args.draft_model_path,
        draft,
        num_layers,
        result,
        engine="sglang",
        declared=f"--speculative-draft-model-path {args.draft_model_path or (draft.path if draft else '')}",
        expected_format="no LlamaForCausalLMEagle3 config, no eagle_config",
    )
    if source is None or num_layers is None:
        return ServingLint(result=result, readings=[])
    if architecture is None:
        result.notes.append("target architecture unknown (no --target, no contract): layer ids unchecked")
        return ServingLint(result=result, readings=[])
    ids = source.nested_ids
    if ids is None and source.top_ids is not None:
        ids = source.top_ids
        result.notes.append("layer ids only at the top level (speculators layout): older SGLang ignores them")
    readings = sglang_readings(ids, num_layers, trained, version, architecture)
    if same_directory(source.path, ids_checked):
        result.notes.append(f"layer ids of {source.path}: see the export check")
        return ServingLint(result=result, readings=readings)
    for r in readings:
        result.rows.append(reading_row(r, num_layers))
    matched = [compare_reading(r, trained, num_layers, result, trained_from=trained_from) for r in readings]
    if (
        version is None
        and len({(r.boundaries, r.problem) for r in readings}) > 1
        and not any(f.check.endswith("layer_ids") for f in result.findings)
    ):
        result.findings.append(_ambiguity_finding(readings, trained, num_layers, architecture))
    elif version is None and any(matched) and not all(matched):
        result.notes.append(
            "the ids are right for some SGLang releases only: pass --sglang-version to check the one you serve with"
        )
    return ServingLint(result=result, readings=readings)


def _ambiguity_finding(
    readings: Sequence[ServedReading], trained: Sequence[int] | None, num_layers: int, architecture: str
) -> Finding:
    fix = "pass --sglang-version to say which SGLang release serves it"
    if trained is not None:
        try:
            ids = engine_ids(Engine.SGLANG, architecture, trained, num_layers).ids
            fix = (
                f"set eagle_config.eagle_aux_hidden_state_layer_ids to {fmt_list(ids)} (every SGLang release read "
                "reads it alike)"
            )
        except BoundaryError:
            fix += "; " + "; ".join(f"{r.label}: {r.fix}" for r in readings)
    return Finding(
        check="serving.sglang.layer_ids",
        severity="error",
        what=f"SGLang releases read these ids as different boundaries on this {architecture} target",
        declared=fmt_list(readings[0].ids),
        actual="; ".join(
            f"{r.label} -> {fmt_list(r.boundaries) if r.boundaries is not None else r.problem}"
            for r in readings
        ),
        fix=fix,
    )
