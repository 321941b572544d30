"""vLLM's EAGLE-3 draft format: the speculators layout (`Eagle3Speculator`), config.json both ways.

Ids go top-level in `eagle_aux_hidden_state_layer_ids` in boundary numbering: vLLM 0.33.0 captures
before layer start_layer and after each layer idx as idx + 1, so boundary 0 and boundary L are
both reachable on Llama, Mistral, Qwen2/3 and Qwen3-MoE targets (DeepSeek: not boundary 0; GLM-4-
MoE-Lite: no EAGLE-3), and it sorts the ids (`eaglewire.contract.numbering.ENGINE_RULES`).
`transformer_layer_config` is one Llama layer whose `vocab_size` is the target's;
`speculators_config` names the verifier (the target, by an absolute path or a hub id) and the
number of speculative tokens vLLM defaults to. Checked against vllm 0.33.0 (its
SpeculatorsConfig parsing and capture loops run on our exports in scripts/test_external.sh) and
speculators 0.9.0 (loads the export, logits compared).
"""

from __future__ import annotations

from typing import Any

from eaglewire.contract.contract import Contract
from eaglewire.contract.numbering import Engine, EngineIds, Numbering, engine_ids
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
    SPECULATORS_ARCHITECTURE,
    SPECULATORS_MODEL_TYPE,
    SPECULATORS_PROPOSAL_TYPE,
)

# Eagle3SpeculatorConfig flags for variants eaglewire's draft does not implement: must be false.
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


def vllm_layer_ids(contract: Contract, version: str | None = None) -> EngineIds:
    """The ids to write for the contract's aux boundaries, and how each vLLM release reads them."""
    return engine_ids(
        Engine.VLLM,
        contract.target.architecture,
        contract.aux_boundaries,
        contract.target.num_layers,
        version,
    )


def speculators_config(
    cfg: DraftConfig,
    layer_ids: tuple[int, ...],
    *,
    dtype: str,
    speculative_tokens: int,
    verifier_name_or_path: str,
    verifier_architecture: str,
) -> dict[str, Any]:
    """config.json in the speculators Eagle3 layout (keys in `keys.SPECULATORS_CONFIG_KEYS`)."""
    return {
        "speculators_model_type": SPECULATORS_MODEL_TYPE,
        "architectures": [SPECULATORS_ARCHITECTURE],
        "transformer_layer_config": llama_layer_dict(cfg, vocab_size=cfg.vocab_size, dtype=dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        # eaglewire's residual is the un-normed hidden state. vLLM reads an absent key as True.
        "norm_before_residual": False,
        **{flag: False for flag in UNSUPPORTED_FLAGS},
        IDS_KEY: list(layer_ids),
        "torch_dtype": dtype,
        "speculators_config": {
            "algorithm": SPECULATORS_MODEL_TYPE,
            "proposal_methods": [
                {"proposal_type": SPECULATORS_PROPOSAL_TYPE, "speculative_tokens": speculative_tokens}
            ],
            "default_proposal_method": SPECULATORS_PROPOSAL_TYPE,
            "verifier": {"name_or_path": verifier_name_or_path, "architectures": [verifier_architecture]},
        },
    }


def read_speculators(config: dict[str, Any], where: str) -> ForeignDraft:
    """Read a vLLM/speculators export's config.json (ids are boundaries by the format)."""
    kind = config.get("speculators_model_type")
    if kind != SPECULATORS_MODEL_TYPE:
        raise ConfigError(
            f"{where}: {expected_actual('speculators_model_type', repr(SPECULATORS_MODEL_TYPE), repr(kind))}",
            fix="use --format sglang for an SGLang export, --format eagle for EAGLE's own checkpoints",
        )
    require_architecture(
        config, SPECULATORS_ARCHITECTURE, where, hint="a speculators Eagle3 export names Eagle3Speculator"
    )
    layer_cfg = config.get("transformer_layer_config")
    if not isinstance(layer_cfg, dict):
        raise ConfigError(
            f"{where}: {expected_actual('transformer_layer_config', 'an object', repr(layer_cfg))}"
        )
    notes: list[str] = []
    layer = read_llama_layer(layer_cfg, f"{where}: transformer_layer_config", notes)
    if "norm_before_residual" not in config:
        raise ConfigError(
            f"{where}: norm_before_residual absent: vLLM reads it as true, the speculators library as false",
            fix="state it explicitly (eaglewire drafts use false: the residual is the un-normed hidden state)",
        )
    if config["norm_before_residual"] is not False:
        raise ConfigError(
            f"{where}: {expected_actual('norm_before_residual', 'false', config['norm_before_residual'])} "
            "(eaglewire drafts add attention to the un-normed hidden state)"
        )
    for flag in UNSUPPORTED_FLAGS:
        if config.get(flag):
            raise ConfigError(
                f"{where}: {expected_actual(flag, 'false', config[flag])} (variant not implemented by eaglewire)"
            )
    if not isinstance(config.get("draft_vocab_size"), int):
        raise ConfigError(
            f"{where}: {expected_actual('draft_vocab_size', 'an integer', repr(config.get('draft_vocab_size')))} "
            "(vLLM reads an absent value as the target vocabulary, the speculators library as 32000)"
        )
    layer["draft_vocab_size"] = int(config["draft_vocab_size"])
    layer["target_hidden_size"] = int(config.get("target_hidden_size") or layer["hidden_size"])
    ids = read_ids(config.get(IDS_KEY), f"{where}: {IDS_KEY}")
    return ForeignDraft(
        fmt="vllm", layer=layer, layer_ids=ids, format_numbering=Numbering.SPECULATORS, notes=tuple(notes)
    )
