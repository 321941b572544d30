"""EAGLE's official EAGLE-3 checkpoints (SafeAILab/EAGLE): read their config.json for import.

The config is a plain `LlamaForCausalLM` with `num_hidden_layers: 1`, `draft_vocab_size` and an
optional `target_hidden_size`; tensors use SGLang's names (`midlayer.*`, `fc`, `norm`,
`lm_head`, `d2t`, `t2d`, optionally `embed_tokens`). There are no layer ids: EAGLE's code
hard-codes the aux boundaries {2, L//2, L-3} (numbering `eagle`). Official releases ship
`pytorch_model.bin` (pickle): those are refused with the one-line conversion to safetensors.
"""

from __future__ import annotations

from typing import Any

from eaglewire.contract.numbering import Numbering
from eaglewire.errors import ConfigError
from eaglewire.export.engine_config import ForeignDraft, read_llama_layer, require_architecture
from eaglewire.export.keys import EAGLE_ARCHITECTURE, IDS_KEY, SGLANG_ARCHITECTURE, SGLANG_NESTED


def read_eagle(config: dict[str, Any], where: str) -> ForeignDraft:
    archs = config.get("architectures")
    if archs == [SGLANG_ARCHITECTURE]:
        raise ConfigError(
            f"{where}: architectures {archs}: this is an SGLang export, not an EAGLE official checkpoint",
            fix="use --format sglang",
        )
    require_architecture(
        config,
        EAGLE_ARCHITECTURE,
        where,
        hint="EAGLE's official EAGLE-3 checkpoints declare LlamaForCausalLM",
    )
    if SGLANG_NESTED in config or IDS_KEY in config:
        raise ConfigError(
            f"{where}: carries layer ids ({SGLANG_NESTED} / {IDS_KEY}), but EAGLE's code takes none (it hard-codes "
            "boundaries {2, L//2, L-3})",
            fix="import it with --format sglang (nested ids) or --format vllm (top-level ids) so the ids are honoured",
        )
    notes: list[str] = []
    layer = read_llama_layer(config, where, notes)
    if "draft_vocab_size" not in config:
        raise ConfigError(
            f"{where}: draft_vocab_size missing: not an EAGLE-3 checkpoint (EAGLE-1/2 drafts have no vocabulary map "
            "and a 2H-wide fc)"
        )
    layer["draft_vocab_size"] = int(config["draft_vocab_size"])
    layer["target_hidden_size"] = int(config.get("target_hidden_size") or layer["hidden_size"])
    return ForeignDraft(
        fmt="eagle", layer=layer, layer_ids=None, format_numbering=Numbering.EAGLE, notes=tuple(notes)
    )
