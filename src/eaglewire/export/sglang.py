"""SGLang's EAGLE-3 draft format (`LlamaForCausalLMEagle3`): config.json both ways and the layer ids.

Layer ids go nested under `eagle_config.eagle_aux_hidden_state_layer_ids` in SGLang's numbering.
SGLang changed how it reads them (PR #25454): ids that the two generations read differently are
refused unless the user names the generation they serve with. The default boundaries
[2, L//2, L-3] give ids starting at 1, which both generations read alike.
"""

from __future__ import annotations

from typing import Any

from eaglewire.contract.contract import Contract
from eaglewire.contract.numbering import (
    SGLANG_GENERATIONS,
    Numbering,
    from_boundaries,
    sglang_ids_unambiguous,
)
from eaglewire.draft.config import DraftConfig
from eaglewire.errors import BoundaryError, ConfigError
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


def parse_generation(generation: str | None) -> Numbering | None:
    if generation is None:
        return None
    try:
        return SGLANG_GENERATIONS[generation]
    except KeyError:
        raise ConfigError(
            f"--sglang-generation: expected one of {sorted(SGLANG_GENERATIONS)}, got {generation!r}"
        ) from None


def sglang_layer_ids(contract: Contract, generation: str | None) -> tuple[tuple[int, ...], str]:
    """(ids to write, the numbering they are in) for the contract's aux boundaries."""
    L = contract.target.num_layers
    numbering = parse_generation(generation)
    if numbering is None:
        return sglang_ids_unambiguous(
            contract.aux_boundaries, L
        ), "sglang (both generations read these alike)"
    ids = from_boundaries(contract.aux_boundaries, numbering, L)
    if ids is None:  # pragma: no cover - only EAGLE returns None
        raise BoundaryError(f"no SGLang ids for {list(contract.aux_boundaries)}")
    return ids, numbering.value


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
    ids = read_ids(nested.get(IDS_KEY), f"{where}: {SGLANG_NESTED}.{IDS_KEY}")
    layer["draft_vocab_size"] = int(config.get("draft_vocab_size") or layer["vocab_size"])
    layer["target_hidden_size"] = int(config.get("target_hidden_size") or layer["hidden_size"])
    if config.get("draft_vocab_size") is None:
        notes.append(f"{where}: draft_vocab_size absent: SGLang would load lm_head from the target (Vd = V)")
    return ForeignDraft(fmt="sglang", layer=layer, layer_ids=ids, format_numbering=None, notes=tuple(notes))
