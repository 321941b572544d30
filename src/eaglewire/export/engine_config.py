"""The Llama-layer part of engine config.json files, both directions, and what an import reads from them.

SGLang's `LlamaForCausalLMEagle3`, vLLM's `Eagle3LlamaForCausalLM` (via speculators'
`transformer_layer_config`) and EAGLE's own `Model` all build the single draft layer from a
`LlamaConfig`. RoPE is written both ways (`rope_theta`/`rope_scaling` for older transformers,
`rope_parameters` for transformers >= 5) so either reader gets the same frequencies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from eaglewire.contract.numbering import Numbering
from eaglewire.draft.config import DraftConfig
from eaglewire.errors import ConfigError, expected_actual
from eaglewire.export.keys import LLAMA_MODEL_TYPE, EngineFormat

log = logging.getLogger(__name__)

# transformers' LlamaConfig defaults, used when an imported config omits a key (logged).
LLAMA_DEFAULTS: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
}


def rope_keys(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    rope_type = rope_parameters.get("rope_type", "default")
    scaling = (
        None if rope_type == "default" else {k: v for k, v in rope_parameters.items() if k != "rope_theta"}
    )
    return {
        "rope_theta": float(rope_parameters["rope_theta"]),
        "rope_scaling": scaling,
        "rope_parameters": dict(rope_parameters),
    }


def llama_layer_dict(cfg: DraftConfig, *, vocab_size: int, dtype: str) -> dict[str, Any]:
    """One Llama decoder layer as engine LlamaConfig keys (num_hidden_layers = 1)."""
    return {
        "model_type": LLAMA_MODEL_TYPE,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.hidden_act,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
        **rope_keys(cfg.rope_parameters),
    }


@dataclass(frozen=True)
class ForeignDraft:
    """What an engine config.json says about a draft, in eaglewire terms (before the target is consulted)."""

    fmt: EngineFormat
    layer: dict[str, Any]  # DraftConfig fields except num_aux/format/extra
    layer_ids: tuple[int, ...] | None  # as written in the file; None = the engine's defaults
    format_numbering: Numbering | None  # what the format says the ids mean (None: SGLang, per release+target)
    notes: tuple[str, ...] = ()


def _int(d: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        if v is None:
            raise ConfigError(f"{where}: required key {key!r} missing")
        raise ConfigError(f"{where}: {expected_actual(key, 'an integer', repr(v))}")
    return v


def _rope_parameters(d: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    rp = d.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp:
        return dict(rp)
    theta = d.get("rope_theta")
    if theta is None:
        theta = LLAMA_DEFAULTS["rope_theta"]
        notes.append(f"{where}: rope_theta absent, using transformers' Llama default {theta}")
    scaling = d.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        out = {k: v for k, v in scaling.items() if k != "type"}
        out.setdefault("rope_type", scaling.get("type"))
        out["rope_theta"] = float(theta)
        return out
    return {"rope_type": "default", "rope_theta": float(theta)}


def read_llama_layer(d: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """Read a LlamaConfig-shaped dict of a single EAGLE-3 layer into DraftConfig fields."""
    model_type = d.get("model_type", LLAMA_MODEL_TYPE)
    if model_type != LLAMA_MODEL_TYPE:
        raise ConfigError(
            f"{where}: {expected_actual('model_type', repr(LLAMA_MODEL_TYPE), repr(model_type))}: eaglewire drafts "
            "are one Llama decoder layer (no q/k norms, no biases)"
        )
    layers = _int(d, "num_hidden_layers", where, 1)
    if layers != 1:
        # Not one model across engines either: both add a later layer's whole residual stream, but sglang 0.5.23
        # normalises it with hidden_norm (models/llama_eagle3.py:103-105), vllm 0.33.0 with input_layernorm
        # (model_executor/models/llama_eagle3.py:136-138): different weights for the same input.
        raise ConfigError(
            f"{where}: {expected_actual('num_hidden_layers', 1, layers)} (multi-layer drafts are not supported: "
            "SGLang and vLLM compute a second draft layer's input differently)"
        )
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where}: {expected_actual('hidden_act', repr('silu'), repr(act))}")
    for flag in ("attention_bias", "mlp_bias"):
        if d.get(flag):
            raise ConfigError(
                f"{where}: {expected_actual(flag, 'false', d[flag])} (eaglewire drafts have no biases)"
            )
    if d.get("tie_word_embeddings"):
        raise ConfigError(
            f"{where}: tie_word_embeddings is true: the engine would use the embedding as lm_head; eaglewire drafts "
            "keep a separate [Vd, H] lm_head",
        )
    hidden = _int(d, "hidden_size", where)
    heads = _int(d, "num_attention_heads", where)
    for key, default in LLAMA_DEFAULTS.items():
        if key != "rope_theta" and key not in d:
            notes.append(f"{where}: {key} absent, using transformers' Llama default {default}")
    return {
        "hidden_size": hidden,
        "intermediate_size": _int(d, "intermediate_size", where),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(d, "num_key_value_heads", where, heads),
        "head_dim": _int(d, "head_dim", where, hidden // heads),
        "vocab_size": _int(d, "vocab_size", where),
        "rms_norm_eps": float(d.get("rms_norm_eps", LLAMA_DEFAULTS["rms_norm_eps"])),
        "rope_parameters": _rope_parameters(d, where, notes),
        "max_position_embeddings": _int(
            d, "max_position_embeddings", where, LLAMA_DEFAULTS["max_position_embeddings"]
        ),
    }


def read_ids(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ConfigError(
            f"{where}: {expected_actual('eagle_aux_hidden_state_layer_ids', 'a non-empty list of integers', repr(value))}"
        )
    return tuple(value)


def require_architecture(config: dict[str, Any], expected: str, where: str, *, hint: str) -> None:
    archs = config.get("architectures")
    if archs != [expected]:
        raise ConfigError(f"{where}: {expected_actual('architectures', [expected], archs)}", fix=hint)
