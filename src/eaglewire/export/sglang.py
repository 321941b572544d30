"""SGLang's EAGLE-3 draft format (`LlamaForCausalLMEagle3`): config.json both ways and the layer ids.

Layer ids go nested under `eagle_config.eagle_aux_hidden_state_layer_ids`. What SGLang makes of
them depends on the release *and* the target architecture (`eaglewire.contract.numbering.
ENGINE_RULES`, read from sglang 0.5.10-0.5.23): Llama, Mistral and Qwen targets add 1 to every id;
DeepSeek-V2/V3 and GLM-4-MoE-Lite targets do so only when the first id is 1 from 0.5.13 on (PR
#25454). No release captures boundary L, and older ones crash on boundary 0 for some
architectures. Ids are written for the release the user names (--sglang-version), or else ids
every release read reads alike; anything else is refused with each release's reading. Checked
against sglang 0.5.23 and 0.5.12 (scripts/test_external.sh runs their id rule on our ids).
"""

from __future__ import annotations

from typing import Any

from eaglewire.contract.contract import Contract
from eaglewire.contract.numbering import Engine, EngineIds, engine_ids
from eaglewire.draft.config import DraftConfig
from eaglewire.errors import ConfigError, expected_actual
from eaglewire.export.engine_config import (
    ForeignDraft,
    llama_layer_dict,
    read_ids,
    read_llama_layer,
    require_architecture,
)
from eaglewire.export.keys import (
    IDS_KEY,
    SGLANG_ARCHITECTURE,
    SGLANG_NESTED,
    USE_AUX_KEY,
)

# Variants sglang's llama_eagle3 builds when these are true (0.5.12 on): eaglewire drafts implement none.
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output")


def sglang_layer_ids(contract: Contract, version: str | None) -> EngineIds:
    """The ids to write for the contract's aux boundaries, and how each SGLang release reads them."""
    return engine_ids(
        Engine.SGLANG,
        contract.target.architecture,
        contract.aux_boundaries,
        contract.target.num_layers,
        version,
    )


def sglang_config(cfg: DraftConfig, layer_ids: tuple[int, ...], *, dtype: str) -> dict[str, Any]:
    """config.json SGLang's LlamaForCausalLMEagle3 reads (keys in `keys.SGLANG_CONFIG_KEYS`)."""
    out: dict[str, Any] = {"architectures": [SGLANG_ARCHITECTURE]}
    out.update(llama_layer_dict(cfg, vocab_size=cfg.vocab_size, dtype=dtype))
    out.update(
        {
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            SGLANG_NESTED: {IDS_KEY: list(layer_ids), USE_AUX_KEY: True},
        }
    )
    return out


def read_sglang(config: dict[str, Any], where: str) -> ForeignDraft:
    """Read an SGLang export's config.json (ids stay in SGLang's numbering; the caller resolves them)."""
    require_architecture(
        config,
        SGLANG_ARCHITECTURE,
        where,
        hint="use --format vllm for a speculators export, --format eagle for EAGLE's own",
    )
    notes: list[str] = []
    layer = read_llama_layer(config, where, notes)
    nested = config.get(SGLANG_NESTED)
    if nested is not None and not isinstance(nested, dict):
        raise ConfigError(f"{where}: {SGLANG_NESTED}: expected an object, got {type(nested).__name__}")
    if nested is None and IDS_KEY in config:
        raise ConfigError(
            f"{where}: top-level {IDS_KEY} without {SGLANG_NESTED}: SGLang reads only "
            f"{SGLANG_NESTED}.{IDS_KEY} and would capture its default layers instead",
            fix=f"move the ids under {SGLANG_NESTED} (stating their numbering), or use --format vllm if this is a "
            "speculators export",
        )
    nested = nested or {}
    if nested.get(USE_AUX_KEY, True) is not True:
        raise ConfigError(
            f"{where}: {SGLANG_NESTED}.{USE_AUX_KEY} = {nested.get(USE_AUX_KEY)!r}: the draft does not read target aux "
            "states (not an EAGLE-3 draft eaglewire can run)"
        )
    for flag in UNSUPPORTED_FLAGS:
        value = nested.get(flag) or config.get(flag)
        if value:
            raise ConfigError(
                f"{where}: {expected_actual(flag, 'false or absent', value)}: sglang (0.5.12 on) builds that variant "
                "(models/llama_eagle3.py:169-207 in 0.5.23); eaglewire drafts have no such step"
            )
    ids = read_ids(nested.get(IDS_KEY), f"{where}: {SGLANG_NESTED}.{IDS_KEY}")
    layer["draft_vocab_size"] = int(config.get("draft_vocab_size") or layer["vocab_size"])
    layer["target_hidden_size"] = int(config.get("target_hidden_size") or layer["hidden_size"])
    if config.get("draft_vocab_size") is None:
        notes.append(f"{where}: draft_vocab_size absent: SGLang would load lm_head from the target (Vd = V)")
    return ForeignDraft(fmt="sglang", layer=layer, layer_ids=ids, format_numbering=None, notes=tuple(notes))
