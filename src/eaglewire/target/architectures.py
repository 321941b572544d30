"""Which Hugging Face causal-LM architectures eaglewire captures from, and where their parts are.

All supported classes share transformers' layout `model.model.{embed_tokens, layers, norm}` and
`model.lm_head`; capture hooks those modules, so no model file is forked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from eaglewire.errors import UnsupportedArchitectureError

# Architecture class -> short family name. The fast runtime (engine) covers LLAMA_FAMILY; the rest
# run through the generic transformers path.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
LLAMA_FAMILY = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def check_architecture(architecture: str | None, *, where: str = "config.json") -> str:
    """Return the family name or raise listing what is supported."""
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{where}: architecture {architecture!r} is not supported; supported: {sorted(SUPPORTED_ARCHITECTURES)}",
            fix="open an issue with the model's config.json; models with the Llama layout usually need one line here",
        )
    return SUPPORTED_ARCHITECTURES[architecture]


def sliding_window_of(config: Any) -> int | None:
    """The attention window some layers of this config use (tokens), None when all attend fully:
    Mistral's `sliding_window`, or any `layer_types` entry "sliding_attention"."""
    window = getattr(config, "sliding_window", None)
    family = SUPPORTED_ARCHITECTURES.get(str((getattr(config, "architectures", None) or ["?"])[0]))
    layer_types = getattr(config, "layer_types", None) or []
    if window is None or not (family == "mistral" or "sliding_attention" in layer_types):
        return None
    return int(window)


def architecture_of(model: Any) -> str:
    archs = getattr(model.config, "architectures", None) or [type(model).__name__]
    return str(archs[0])


@dataclass(frozen=True)
class TargetParts:
    """The modules capture and the engine need from a loaded target."""

    embed_tokens: nn.Embedding
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Module

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def target_parts(model: Any) -> TargetParts:
    arch = architecture_of(model)
    check_architecture(arch, where=f"{type(model).__name__}.config.architectures")
    base = model.model
    return TargetParts(
        embed_tokens=base.embed_tokens,
        layers=base.layers,
        final_norm=base.norm,
        lm_head=model.lm_head,
    )
