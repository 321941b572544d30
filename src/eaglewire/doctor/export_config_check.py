"""The keys of an SGLang or vLLM/speculators export other than the layer ids, read the way the engine reads them.

Part of `export_check` (which reads the layer ids): `draft_vocab_size` against lm_head.weight's rows
and d2t's length; `target_hidden_size` against fc.weight (both engines build fc
`target_hidden_size * 3` wide for our exports: vllm 0.33.0 always for a speculators config, sglang from the
number of ids, 3 here; absent = `hidden_size`), the contract and the target; `hidden_size`,
`vocab_size`, the single layer, `tie_word_embeddings`, SGLang's fc `bias` and `use_aux_hidden_state`;
norm flags (vLLM reads `norm_before_residual`, absent = true, and the speculators variant flags;
SGLang's llama_eagle3 reads no norm_before_residual: attention is always added to the un-normed
hidden state, as eaglewire trains; from 0.5.12 it reads norm_before_fc, fc_norm/use_aux_norm and
norm_output, variants eaglewire does not train); the speculators block (algorithm, default speculative_tokens, verifier
architecture). Sources: `eaglewire.export.keys`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eaglewire.contract.contract import Contract
from eaglewire.doctor.draft_source import SGLANG_NESTED, DraftSource
from eaglewire.doctor.findings import CheckResult, Finding, Row
from eaglewire.export.keys import (
    ENGINE_NUM_AUX,
    LLAMA_MODEL_TYPE,
    SGLANG_ARCHITECTURE,
    SPECULATORS_ARCHITECTURE,
    SPECULATORS_MODEL_TYPE,
    USE_AUX_KEY,
)
from eaglewire.export.vllm import UNSUPPORTED_FLAGS
from eaglewire.target.loading import LoadedTarget

ENGINE_NAME = {"sglang": "SGLang", "vllm": "vLLM"}
NORM_BEFORE_RESIDUAL = "norm_before_residual"
# Variant flags sglang's llama_eagle3 reads (0.5.12 on; 0.5.23 lines 169-207) -> where it reads them.
SGLANG_VARIANT_FLAGS = {
    "norm_before_fc": (f"{SGLANG_NESTED}.norm_before_fc", "norm_before_fc"),
    "fc_norm": ("fc_norm",),
    "use_aux_norm": ("use_aux_norm",),
    "norm_output": ("norm_output",),
}
SIZE_KEYS = ("draft_vocab_size", "target_hidden_size", "hidden_size", "vocab_size", "num_hidden_layers")


def check_export_config(
    source: DraftSource, contract: Contract | None, target: LoadedTarget | None, result: CheckResult
) -> None:
    """Every key of `source`'s config.json but the layer ids, into `result` (rows and findings)."""
    cfg_path = source.path / "config.json"
    _architecture(source, cfg_path, result)
    _not_integers(source, cfg_path, result)
    _shapes(source, source.kind, cfg_path, contract, target, result)
    if source.kind == "sglang":
        _sglang_flags(source, cfg_path, result)
    else:
        _vllm_flags(source, cfg_path, result)
        _speculators_block(source, cfg_path, contract, target, result)


def _layer_config(source: DraftSource) -> dict[str, Any]:
    """The dict holding the Llama layer keys: the config itself (SGLang) or transformer_layer_config (vLLM)."""
    if source.kind == "vllm":
        layer = source.config.get("transformer_layer_config")
        return layer if isinstance(layer, dict) else {}
    return source.config


def _int_value(d: dict[str, Any], key: str) -> int | None:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _finding(
    result: CheckResult, engine: str, key: str, what: str, declared: str, actual: str, fix: str
) -> None:
    result.findings.append(
        Finding(
            check=f"export.{engine}.{key}",
            severity="error",
            what=what,
            declared=declared,
            actual=actual,
            fix=fix,
        )
    )


def _architecture(source: DraftSource, cfg_path: Path, result: CheckResult) -> None:
    engine = source.kind
    want = [SGLANG_ARCHITECTURE] if engine == "sglang" else [SPECULATORS_ARCHITECTURE]
    got = source.config.get("architectures")
    result.rows.append(
        Row(
            item="architectures",
            declared=str(got),
            actual=f"{ENGINE_NAME[engine]} needs {want}",
            ok=got == want,
        )
    )
    if got != want:
        _finding(
            result,
            engine,
            "architectures",
            f"{ENGINE_NAME[engine]} will not load this directory as an EAGLE-3 draft of this layout",
            f"{cfg_path}: architectures = {got}",
            f"{ENGINE_NAME[engine]} builds the draft class from architectures; {want} is its EAGLE-3 Llama draft",
            f'set "architectures": {want} in {cfg_path}',
        )
    if engine == "vllm" and source.config.get("speculators_model_type") != SPECULATORS_MODEL_TYPE:
        got_type = source.config.get("speculators_model_type")
        _finding(
            result,
            engine,
            "speculators_model_type",
            "vLLM will not translate this speculators config as EAGLE-3",
            f"{cfg_path}: speculators_model_type = {got_type!r}",
            f"vLLM's speculators reader dispatches on it; {SPECULATORS_MODEL_TYPE!r} is EAGLE-3",
            f'set "speculators_model_type": "{SPECULATORS_MODEL_TYPE}" in {cfg_path}',
        )


def _not_integers(source: DraftSource, cfg_path: Path, result: CheckResult) -> None:
    """Size keys present but not integers: the engine's LlamaConfig would refuse or misread them."""
    holders = [("", source.config)]
    if source.kind == "vllm":
        holders.append(("transformer_layer_config.", _layer_config(source)))
    for prefix, holder in holders:
        for key in SIZE_KEYS:
            v = holder.get(key)
            if v is not None and _int_value(holder, key) is None:
                _finding(
                    result, source.kind, key,
                    f"{prefix}{key} is not an integer",
                    f"{cfg_path}: {prefix}{key} = {json.dumps(v)}",
                    f"{ENGINE_NAME[source.kind]} needs an integer size",
                    f"write {prefix}{key} as an integer in {cfg_path}",
                )  # fmt: skip


def _shapes(
    source: DraftSource,
    engine: str,
    cfg_path: Path,
    contract: Contract | None,
    target: LoadedTarget | None,
    result: CheckResult,
) -> None:
    layer = _layer_config(source)
    layer_where = "transformer_layer_config." if engine == "vllm" else ""
    fc, lm_head = source.tensors.get("fc.weight"), source.tensors.get("lm_head.weight")
    d2t, embed = source.tensors.get("d2t"), source.tensors.get("embed_tokens.weight")
    ht = target.hidden_size if target is not None else (contract.target.hidden_size if contract else None)
    vocab = target.vocab_size if target is not None else (contract.target.vocab_size if contract else None)
    ht_from = "the target" if target is not None else "contract.json"
    name = ENGINE_NAME[engine]

    hidden = _int_value(layer, "hidden_size")
    if fc is not None and hidden is not None and int(fc.shape[0]) != hidden:
        _finding(
            result, engine, "hidden_size",
            f"{layer_where}hidden_size disagrees with the weights: {name} builds fc and the layer {hidden} wide",
            f"{cfg_path}: {layer_where}hidden_size = {hidden}",
            f"fc.weight has {int(fc.shape[0])} output rows (the draft's hidden size)",
            f"set {layer_where}hidden_size to {int(fc.shape[0])} in {cfg_path}",
        )  # fmt: skip

    # target_hidden_size: fc is target_hidden_size * 3 wide for our exports (absent: hidden_size; keys.py)
    ths = _int_value(source.config, "target_hidden_size")
    effective = ths if ths is not None else hidden
    shown = str(ths) if ths is not None else f"absent (read as hidden_size = {hidden})"
    if effective is not None:
        want_fc = ENGINE_NUM_AUX * effective
        fc_in = int(fc.shape[1]) if fc is not None else None
        result.rows.append(
            Row(
                item="target_hidden_size",
                declared=shown,
                actual=f"{name} builds fc with {ENGINE_NUM_AUX}*{effective} = {want_fc} inputs; fc.weight has {fc_in}; "
                f"target hidden {ht} ({ht_from})",
                ok=(fc_in is None or fc_in == want_fc) and (ht is None or effective == ht),
            )
        )
        if ht is not None and effective != ht:
            _finding(
                result, engine, "target_hidden_size",
                f"target_hidden_size disagrees with the target's hidden size ({ht_from})",
                f"{cfg_path}: target_hidden_size = {shown}",
                f"the target's hidden size is {ht}: {name} would build fc for {want_fc} inputs instead of "
                f"{ENGINE_NUM_AUX * ht}",
                f"set target_hidden_size to {ht} in {cfg_path}",
            )  # fmt: skip
        elif fc_in is not None and fc_in != want_fc:
            _finding(
                result, engine, "fc_width",
                f"fc.weight is not {ENGINE_NUM_AUX} * target_hidden_size wide: {name} cannot load it",
                f"{name} builds fc with {ENGINE_NUM_AUX} * {effective} = {want_fc} inputs (target_hidden_size)",
                f"{source.path}: fc.weight in_features = {fc_in}"
                + (f" (= {fc_in // effective} aux states)" if effective and fc_in % effective == 0 else ""),
                "the draft reads another number of aux states or was trained for another target; engines need "
                f"exactly {ENGINE_NUM_AUX} aux states: retrain with {ENGINE_NUM_AUX} aux boundaries",
            )  # fmt: skip
    if contract is not None and fc is not None and int(fc.shape[1]) != contract.aux_width:
        _finding(
            result, engine, "fc_width_vs_contract",
            "fc.weight's width disagrees with the export's contract (A*Ht)",
            f"contract.json: {contract.num_aux} aux boundaries * Ht {contract.target.hidden_size} = {contract.aux_width}",
            f"{source.path}: fc.weight in_features = {int(fc.shape[1])}",
            "export the draft again with `eaglewire export` (the contract and the weights come from different drafts)",
        )  # fmt: skip

    # draft_vocab_size: lm_head rows and d2t entries
    vd = _int_value(source.config, "draft_vocab_size")
    rows = int(lm_head.shape[0]) if lm_head is not None else None
    layer_vocab = _int_value(layer, "vocab_size")
    if vd is None and source.config.get("draft_vocab_size") is None:
        read_as = layer_vocab if engine == "sglang" else None
        if engine == "vllm" or (rows is not None and read_as is not None and rows != read_as):
            _finding(
                result, engine, "draft_vocab_size",
                "draft_vocab_size is absent: the engine reads another draft vocabulary than the weights have",
                f"{cfg_path}: draft_vocab_size absent",
                "SGLang then loads lm_head from the target (Vd = vocab_size)"
                if engine == "sglang"
                else "vLLM then reads the target vocabulary, the speculators library 32000"
                + (f"; lm_head.weight has {rows} rows" if rows is not None else ""),
                f"set draft_vocab_size to {rows} in {cfg_path}" if rows is not None else "state draft_vocab_size",
            )  # fmt: skip
    elif vd is not None:
        problems = []
        if rows is not None and rows != vd:
            problems.append(f"lm_head.weight has {rows} rows")
        if d2t is not None and int(d2t.numel()) != vd:
            problems.append(f"d2t has {int(d2t.numel())} entries")
        if vocab is not None and vd > vocab:
            problems.append(f"the target vocabulary has only {vocab} tokens")
        result.rows.append(
            Row(
                item="draft_vocab_size",
                declared=str(vd),
                actual="; ".join(problems)
                or f"lm_head.weight rows {rows}, d2t entries "
                f"{int(d2t.numel()) if d2t is not None else 'absent'}",
                ok=not problems,
            )
        )
        if problems:
            right = rows if rows is not None else (int(d2t.numel()) if d2t is not None else None)
            _finding(
                result, engine, "draft_vocab_size",
                f"draft_vocab_size disagrees with the weights: {name} builds lm_head with {vd} rows",
                f"{cfg_path}: draft_vocab_size = {vd}",
                "; ".join(problems),
                f"set draft_vocab_size to {right} in {cfg_path}" if right is not None and right != vd
                else "export the draft again with `eaglewire export`",
            )  # fmt: skip

    # vocab_size (the target's): the embedding and t2d
    if layer_vocab is not None and vocab is not None and layer_vocab != vocab:
        _finding(
            result, engine, "vocab_size",
            f"{layer_where}vocab_size disagrees with the target's vocabulary ({'the target' if target else 'contract.json'})",
            f"{cfg_path}: {layer_where}vocab_size = {layer_vocab}",
            f"the target has {vocab} tokens",
            f"set {layer_where}vocab_size to {vocab} in {cfg_path}",
        )  # fmt: skip
    elif embed is not None and layer_vocab is not None and int(embed.shape[0]) != layer_vocab:
        _finding(
            result, engine, "vocab_size",
            f"{layer_where}vocab_size disagrees with embed_tokens.weight",
            f"{cfg_path}: {layer_where}vocab_size = {layer_vocab}",
            f"embed_tokens.weight has {int(embed.shape[0])} rows",
            "export the draft again with `eaglewire export`",
        )  # fmt: skip

    layers = _int_value(layer, "num_hidden_layers")
    if layers is not None and layers != 1:
        _finding(
            result, engine, "num_hidden_layers",
            f"{name} builds {layers} draft layers; the weights hold one",
            f"{cfg_path}: {layer_where}num_hidden_layers = {layers}",
            "eaglewire drafts are a single decoder layer: the others would run with weights never trained",
            f"set {layer_where}num_hidden_layers to 1 in {cfg_path}",
        )  # fmt: skip
    if layer.get("tie_word_embeddings"):
        _finding(
            result, engine, "tie_word_embeddings",
            f"{name} will use the embedding as lm_head (tie_word_embeddings)",
            f"{cfg_path}: {layer_where}tie_word_embeddings = true",
            "eaglewire drafts keep a separate [Vd, H] lm_head",
            f"set {layer_where}tie_word_embeddings to false in {cfg_path}",
        )  # fmt: skip


def _sglang_flags(source: DraftSource, cfg_path: Path, result: CheckResult) -> None:
    cfg = source.config
    nested = cfg.get(SGLANG_NESTED)
    if isinstance(nested, dict) and nested.get(USE_AUX_KEY, True) is not True:
        _finding(
            result, "sglang", USE_AUX_KEY,
            "SGLang will not feed the draft the target's aux states",
            f"{cfg_path}: {SGLANG_NESTED}.{USE_AUX_KEY} = {nested.get(USE_AUX_KEY)!r}",
            "the draft's fc gets the last hidden state only, not the A*Ht aux states it was trained on",
            f"set {SGLANG_NESTED}.{USE_AUX_KEY} to true in {cfg_path}",
        )  # fmt: skip
    if cfg.get("bias"):
        _finding(
            result, "sglang", "bias",
            "SGLang builds fc with a bias (config key 'bias'); the draft has none, so it stays untrained",
            f"{cfg_path}: bias = {cfg['bias']!r}",
            "eaglewire's fc has no bias (fc.bias is not in the weights)",
            f"remove 'bias' from {cfg_path}",
        )  # fmt: skip
    nested_cfg = nested if isinstance(nested, dict) else {}
    for name, holders in SGLANG_VARIANT_FLAGS.items():
        where = next(
            (h for h in holders if (nested_cfg if h.startswith(SGLANG_NESTED) else cfg).get(name)), None
        )
        if where is None:
            continue
        value = (nested_cfg if where.startswith(SGLANG_NESTED) else cfg)[name]
        _finding(
            result, "sglang", name,
            f"SGLang (0.5.12 on) builds the draft with {name}, a variant eaglewire does not train",
            f"{cfg_path}: {where} = {json.dumps(value)}",
            f"eaglewire drafts have no {name} step (sglang 0.5.23 models/llama_eagle3.py:169-207 reads it)",
            f"remove {where} from {cfg_path}",
        )  # fmt: skip
    flag = cfg.get(NORM_BEFORE_RESIDUAL)
    result.rows.append(
        Row(
            item=NORM_BEFORE_RESIDUAL,
            declared="absent" if flag is None else json.dumps(flag),
            actual="SGLang reads no such flag: attention is added to the un-normed hidden state, as trained",
            ok=True,
        )
    )
    if flag:
        result.notes.append(
            f"{cfg_path}: {NORM_BEFORE_RESIDUAL} = {json.dumps(flag)} is ignored by SGLang, but vLLM would honour it if it "
            "served this directory"
        )


def _vllm_flags(source: DraftSource, cfg_path: Path, result: CheckResult) -> None:
    cfg = source.config
    flag = cfg.get(NORM_BEFORE_RESIDUAL)
    ok = flag is False
    result.rows.append(
        Row(
            item=NORM_BEFORE_RESIDUAL,
            declared="absent" if flag is None else json.dumps(flag),
            actual="vLLM reads "
            + ("true (absent)" if flag is None else json.dumps(bool(flag)))
            + "; trained: false (attention added to the un-normed hidden state)",
            ok=ok,
        )
    )
    if not ok:
        _finding(
            result, "vllm", NORM_BEFORE_RESIDUAL,
            "vLLM will normalise the hidden state before the residual; the draft was trained without",
            f"{cfg_path}: {NORM_BEFORE_RESIDUAL} = " + ("absent (vLLM reads it as true)" if flag is None else json.dumps(flag)),
            "eaglewire drafts add attention to the un-normed hidden state (norm_before_residual false)",
            f'set "{NORM_BEFORE_RESIDUAL}": false in {cfg_path}',
        )  # fmt: skip
    for name in UNSUPPORTED_FLAGS:
        if cfg.get(name):
            _finding(
                result, "vllm", name,
                f"{name} asks vLLM/speculators for a draft variant this draft was not trained as",
                f"{cfg_path}: {name} = {json.dumps(cfg[name])}",
                f"eaglewire drafts have no {name} step",
                f'set "{name}": false in {cfg_path}',
            )  # fmt: skip
    if not isinstance(cfg.get("transformer_layer_config"), dict):
        _finding(
            result, "vllm", "transformer_layer_config",
            "no transformer_layer_config: vLLM cannot build the draft's decoder layer",
            f"{cfg_path}: transformer_layer_config = {json.dumps(cfg.get('transformer_layer_config'))}",
            "the speculators layout keeps the Llama layer's keys (hidden_size, heads, vocab_size, ...) there",
            "export the draft again with `eaglewire export --format vllm`",
        )  # fmt: skip
    elif _layer_config(source).get("model_type") != LLAMA_MODEL_TYPE:
        got = _layer_config(source).get("model_type")
        _finding(
            result, "vllm", "model_type",
            "the speculators layer type is not Llama (absent: the speculators library builds a Qwen3 layer)",
            f"{cfg_path}: transformer_layer_config.model_type = {got!r}",
            "eaglewire drafts are one Llama decoder layer (no q/k norms)",
            f'set transformer_layer_config.model_type to "{LLAMA_MODEL_TYPE}" in {cfg_path}',
        )  # fmt: skip


def _speculators_block(
    source: DraftSource,
    cfg_path: Path,
    contract: Contract | None,
    target: LoadedTarget | None,
    result: CheckResult,
) -> None:
    block = source.config.get("speculators_config")
    if not isinstance(block, dict):
        result.notes.append(
            f"{cfg_path}: no speculators_config block: pass --speculative-config to vLLM yourself"
        )
        return
    algo = block.get("algorithm")
    if algo != SPECULATORS_MODEL_TYPE:
        _finding(
            result, "vllm", "speculators_config.algorithm",
            "the speculators block does not name EAGLE-3",
            f"{cfg_path}: speculators_config.algorithm = {algo!r}",
            "vLLM reads the method from it when serving this directory",
            f'set speculators_config.algorithm to "{SPECULATORS_MODEL_TYPE}" in {cfg_path}',
        )  # fmt: skip
    methods = block.get("proposal_methods")
    first = methods[0] if isinstance(methods, list) and methods and isinstance(methods[0], dict) else {}
    tokens = _int_value(first, "speculative_tokens")
    result.rows.append(
        Row(
            item="speculators_config.proposal_methods[0].speculative_tokens",
            declared=repr(first.get("speculative_tokens")),
            actual=f"vLLM's default num_speculative_tokens = {tokens}"
            if tokens
            else "not a positive integer",
            ok=tokens is not None and tokens >= 1,
        )
    )
    if tokens is None or tokens < 1:
        _finding(
            result, "vllm", "speculators_config.speculative_tokens",
            "the speculators block has no positive speculative_tokens (vLLM's default draft length)",
            f"{cfg_path}: speculators_config.proposal_methods[0].speculative_tokens = {first.get('speculative_tokens')!r}",
            "vLLM refuses it or needs num_speculative_tokens given explicitly",
            "export again with `eaglewire export --num-steps N` (N draft tokens per round)",
        )  # fmt: skip
    verifier = block.get("verifier")
    archs = verifier.get("architectures") if isinstance(verifier, dict) else None
    want = target.architecture if target is not None else (contract.target.architecture if contract else None)
    if want is not None and archs is not None and archs != [want]:
        _finding(
            result, "vllm", "speculators_config.verifier",
            "the speculators block names another target architecture than the draft's target",
            f"{cfg_path}: speculators_config.verifier.architectures = {archs}",
            f"the target is {want} ({'the target' if target is not None else 'contract.json'})",
            f'set speculators_config.verifier.architectures to ["{want}"] in {cfg_path}',
        )  # fmt: skip
