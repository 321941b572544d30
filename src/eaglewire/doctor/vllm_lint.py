"""Lint a vLLM speculative config and the draft config the way vLLM reads them.

vLLM 0.33.0 reads the draft's top-level `eagle_aux_hidden_state_layer_ids` as boundaries and
captures them in layer order (`eaglewire.contract.numbering.ENGINE_RULES`: boundary 0 and L on
Llama, Mistral, Qwen2/3 and Qwen3-MoE targets; not boundary 0 on DeepSeek; no EAGLE-3 on GLM-4-MoE-
Lite). Without the top-level key its V1 runner falls back to `eagle_config.eagle_aux_hidden_state_
layer_ids`, read as boundaries too (v1/worker/gpu_model_runner.py:5207-5219: an SGLang export served by
vLLM is one boundary off), while the V2 model runner ignores that key and uses the target's default
[2, L//2, L-3] (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:116-150). vLLM's EAGLE proposer
drafts greedily (argmax) whatever the request temperature, so at temperature > 0 acceptance falls
below what the draft's accuracy predicts (still lossless: verification samples properly).

Input file: JSON, either `{"speculative_config": {...}, "temperature": 0.7}` or the speculative
config itself (`{"method": "eagle3", "model": DIR, "num_speculative_tokens": 3}`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from eaglewire.contract.numbering import Engine, Numbering, engine_readings, to_boundaries
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
from eaglewire.errors import BoundaryError, ConfigError
from eaglewire.typed_config import read_json_file

CHECK = "serving: vllm"


def load_vllm_config(path: Path) -> dict[str, Any]:
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a JSON object with speculative_config (or the speculative config itself)"
        )
    spec = data.get("speculative_config", data)
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: speculative_config: expected an object, got {type(spec).__name__}")
    if "method" not in spec and "model" not in spec and "num_speculative_tokens" not in spec:
        raise ConfigError(
            f"{path}: no speculative config keys (method, model, num_speculative_tokens) found",
            fix='write {"speculative_config": {"method": "eagle3", "model": "<draft dir>", "num_speculative_tokens": 3}}',
        )
    return data


def _temperature(data: dict[str, Any]) -> float | None:
    for holder in (data, data.get("sampling_params"), data.get("sampling")):
        if isinstance(holder, dict) and isinstance(holder.get("temperature"), int | float):
            return float(holder["temperature"])
    return None


def vllm_readings(
    source: DraftSource,
    num_layers: int,
    trained: Sequence[int] | None,
    architecture: str | None = None,
    version: str | None = None,
) -> list[ServedReading]:
    fix = (
        f'set "eagle_aux_hidden_state_layer_ids": {fmt_list(trained)} at the top level of the draft\'s config.json'
        if trained is not None
        else "set the top-level eagle_aux_hidden_state_layer_ids to the boundaries the draft was trained on"
    )

    def reading(label: str, ids: tuple[int, ...] | None) -> list[ServedReading]:
        if architecture is None:  # no table row to apply: the id rule alone
            try:
                bounds = to_boundaries(ids, Numbering.VLLM, num_layers)
                return [ServedReading("vllm", label, ids, bounds, fix=fix)]
            except BoundaryError as e:
                return [ServedReading("vllm", label, ids, None, problem=str(e).splitlines()[0], fix=fix)]
        out = []
        for r in engine_readings(Engine.VLLM, architecture, ids, num_layers, version):
            served = served_reading(r, fix)
            out.append(replace(served, label=label.replace("vLLM", r.label, 1)))
        return out

    if source.top_ids is not None:
        return reading("vLLM", source.top_ids)
    if source.nested_ids is not None:
        return [
            *reading("vLLM (V1 runner: reads eagle_config ids as boundaries)", source.nested_ids),
            *reading("vLLM (V2 model runner: ignores eagle_config, target defaults)", None),
        ]
    return reading("vLLM (no ids: target defaults)", None)


def lint_vllm(
    data: dict[str, Any],
    *,
    draft: DraftSource | None,
    num_layers: int | None,
    trained: Sequence[int] | None,
    trained_from: str = "the draft's contract",
    ids_checked: Path | None = None,
    architecture: str | None = None,
    version: str | None = None,
) -> ServingLint:
    """Lint a vLLM config dict (see module docstring) against the boundaries the draft was trained on.

    ids_checked: an export whose layer ids the export check already compared (see `lint_sglang`)."""
    result = CheckResult(name=CHECK)
    spec = data.get("speculative_config", data)
    method = spec.get("method")
    result.rows.append(Row(item="method", declared=str(method), actual=str(method), ok=method == "eagle3"))
    if method != "eagle3":
        result.findings.append(
            Finding(
                check="serving.vllm.method",
                severity="error",
                what="vLLM will not run the draft as EAGLE-3" if method else "no speculative method set",
                declared=f"method={method!r}",
                actual="EAGLE-3 aux states are not captured" if method else "no speculation",
                fix='"method": "eagle3" in speculative_config',
            )
        )
    n = spec.get("num_speculative_tokens")
    result.rows.append(
        Row(
            item="num_speculative_tokens",
            declared=str(n),
            actual=f"chain of {n}" if n else "missing",
            ok=isinstance(n, int) and n >= 1,
        )
    )
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        result.findings.append(
            Finding(
                check="serving.vllm.num_speculative_tokens",
                severity="error",
                what="num_speculative_tokens missing or not a positive integer",
                declared=repr(n),
                actual="vLLM refuses the config",
                fix='"num_speculative_tokens": 3 (the chain length; measure with eaglewire bench)',
            )
        )
    temp = _temperature(data)
    if temp is not None and temp > 0:
        result.findings.append(
            Finding(
                check="serving.vllm.temperature",
                severity="warning",
                what="vLLM drafts greedily: at temperature > 0 acceptance is lower than the draft's accuracy predicts",
                declared=f"temperature={temp}",
                actual="draft tokens are argmax of the draft, verified against sampled target tokens",
                fix="expect lower acceptance at this temperature (benchmark it), or serve at temperature 0",
            )
        )
    source = loadable_draft_source(
        spec.get("model"),
        draft,
        num_layers,
        result,
        engine="vllm",
        declared=f"model={spec.get('model') or (draft.path if draft else '')}",
        expected_format="not the speculators format",
    )
    if source is None or num_layers is None:
        return ServingLint(result=result, readings=[])
    readings = vllm_readings(source, num_layers, trained, architecture, version)
    if same_directory(source.path, ids_checked):
        result.notes.append(f"layer ids of {source.path}: see the export check")
        return ServingLint(result=result, readings=readings)
    for r in readings:
        result.rows.append(reading_row(r, num_layers))
        compare_reading(r, trained, num_layers, result, trained_from=trained_from)
    return ServingLint(result=result, readings=readings)
