"""Read a loaded Hugging Face Llama-family target into the compact runtime's flat weight layout.

Nothing from transformers' modeling files is reused: the runtime needs only the tensors. q/k/v
are stacked into one [(Hq+2Hkv)*hd, Ht] matrix and gate/up into one [2I, Ht] matrix so a decode
step launches one matrix product for each. Every tensor is shared with the Hugging Face model, not
copied: the stacked ones too, whose rows the model's q/k/v and gate/up weights become views of
(`stack_linears`), unless the runtime casts to another dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from eaglewire.errors import UnsupportedArchitectureError
from eaglewire.nn.rope import rope_inv_freq
from eaglewire.nn.stacked import stack_in_place
from eaglewire.target.architectures import LLAMA_FAMILY, check_architecture, sliding_window_of, target_parts

SUPPORTED_ACTIVATIONS = ("silu",)


@dataclass(frozen=True)
class ModelSpec:
    """Static sizes of a Llama-family target (hashable: compiled functions specialise on it)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_eps: float
    qk_norm: bool

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim


# Order of the per-layer tensors handed to the layer function (None where the model has none).
LAYER_FIELDS = (
    "input_norm",  # [Ht]
    "qkv",  # [(Hq+2Hkv)*hd, Ht]
    "qkv_bias",  # [(Hq+2Hkv)*hd] | None   (Qwen2; Llama with attention_bias)
    "q_norm",  # [hd] | None               (Qwen3)
    "k_norm",  # [hd] | None
    "o",  # [Ht, Hq*hd]
    "o_bias",  # [Ht] | None
    "post_norm",  # [Ht]
    "gate_up",  # [2I, Ht]
    "gate_up_bias",  # [2I] | None
    "down",  # [Ht, I]
    "down_bias",  # [Ht] | None
)

LayerTensors = tuple[torch.Tensor | None, ...]


@dataclass
class TargetWeights:
    spec: ModelSpec
    embed: torch.Tensor  # [V, Ht]
    layers: list[LayerTensors]  # one tuple per layer, in LAYER_FIELDS order
    final_norm: torch.Tensor  # [Ht]
    lm_head: torch.Tensor  # [V, Ht] (the embedding itself when tied)
    rope_inv_freq: torch.Tensor  # [hd/2] float32
    rope_scaling: float


def _cfg(config: Any, name: str, default: Any = None) -> Any:
    return getattr(config, name, default)


def _bias(module: nn.Module) -> torch.Tensor | None:
    b = getattr(module, "bias", None)
    return None if b is None else b.detach()


def _cat_bias(mods: list[nn.Module], widths: list[int], like: torch.Tensor) -> torch.Tensor | None:
    biases = [_bias(m) for m in mods]
    if all(b is None for b in biases):
        return None
    parts = [b if b is not None else like.new_zeros(w) for b, w in zip(biases, widths, strict=True)]
    return torch.cat(parts)


def stack_linears(linears: list[Any], dtype: torch.dtype | None) -> torch.Tensor:
    """The linears' weights as one [sum of out, in] tensor. Without a cast, each weight becomes a view
    of its rows, so the runtime and the Hugging Face model hold one copy between them: a second
    copy of q/k/v and gate/up would be 9.1 GB at the Llama-3.1-8B shape in bf16 (log §2zg). The
    values do not change, and the model runs as before."""
    if dtype is not None and linears[0].weight.dtype != dtype:  # the runtime's own dtype: a copy
        return torch.cat([m.weight.detach() for m in linears]).to(dtype)
    return stack_in_place(linears)


def check_fast_supported(config: Any, max_seq_len: int) -> None:
    """Raise UnsupportedArchitectureError when the compact model cannot reproduce this config."""
    arch = str((_cfg(config, "architectures") or ["?"])[0])
    family = check_architecture(arch, where="config.architectures")
    if family not in LLAMA_FAMILY:
        raise UnsupportedArchitectureError(
            f"fast target runtime: architecture {arch} ({family}) is not in the Llama family {sorted(LLAMA_FAMILY)}",
            fix="use make_runner(...), which falls back to the recompute runner",
        )
    act = _cfg(config, "hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedArchitectureError(
            f"fast target runtime: config.hidden_act={act!r}, supported: {SUPPORTED_ACTIVATIONS}"
        )
    window = sliding_window_of(config)
    if window is not None and max_seq_len > window:
        raise UnsupportedArchitectureError(
            f"fast target runtime: config.sliding_window={window} is smaller than max_seq_len={max_seq_len}; "
            "the compact model implements full attention only",
            fix=f"use max_seq_len <= {window}, or the recompute runner (make_runner falls back to it)",
        )


@torch.no_grad()
def extract_weights(model: nn.Module, dtype: torch.dtype | None = None) -> TargetWeights:
    """Pull a Llama-family HF model's tensors into TargetWeights (optionally cast to `dtype`)."""
    config: Any = model.config
    parts = target_parts(model)
    num_heads = int(config.num_attention_heads)
    num_kv = int(_cfg(config, "num_key_value_heads") or num_heads)
    hidden = int(config.hidden_size)
    head_dim = int(_cfg(config, "head_dim") or hidden // num_heads)
    qk_norm = hasattr(parts.layers[0].self_attn, "q_norm")
    spec = ModelSpec(
        num_layers=len(parts.layers),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=head_dim,
        intermediate_size=int(config.intermediate_size),
        vocab_size=int(config.vocab_size),
        rms_eps=float(config.rms_norm_eps),
        qk_norm=qk_norm,
    )

    def cast(t: Any) -> torch.Tensor | None:
        if t is None:
            return None
        t = t.detach()
        return t if dtype is None or t.dtype == dtype else t.to(dtype)

    layers: list[LayerTensors] = []
    layer: Any
    for layer in parts.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_mods = [attn.q_proj, attn.k_proj, attn.v_proj]
        qkv = stack_linears(qkv_mods, dtype)
        qkv_bias = _cat_bias(qkv_mods, [spec.q_width, spec.kv_width, spec.kv_width], qkv)
        gate_up = stack_linears([mlp.gate_proj, mlp.up_proj], dtype)
        gate_up_bias = _cat_bias([mlp.gate_proj, mlp.up_proj], [spec.intermediate_size] * 2, gate_up)
        tensors: dict[str, Any] = {
            "input_norm": layer.input_layernorm.weight,
            "qkv": qkv,
            "qkv_bias": qkv_bias,
            "q_norm": attn.q_norm.weight if qk_norm else None,
            "k_norm": attn.k_norm.weight if qk_norm else None,
            "o": attn.o_proj.weight,
            "o_bias": _bias(attn.o_proj),
            "post_norm": layer.post_attention_layernorm.weight,
            "gate_up": gate_up,
            "gate_up_bias": gate_up_bias,
            "down": mlp.down_proj.weight,
            "down_bias": _bias(mlp.down_proj),
        }
        layers.append(tuple(cast(tensors[name]) for name in LAYER_FIELDS))

    rope_params = dict(_cfg(config, "rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0})
    max_pos = int(_cfg(config, "max_position_embeddings", 4096))
    inv_freq, scaling = rope_inv_freq(rope_params, head_dim, max_pos)
    embed = cast(parts.embed_tokens.weight)
    lm_head = cast(parts.lm_head.weight)
    assert embed is not None and lm_head is not None
    final_norm = cast(parts.final_norm.weight)
    assert final_norm is not None
    return TargetWeights(
        spec=spec,
        embed=embed,
        layers=layers,
        final_norm=final_norm,
        lm_head=lm_head,
        rope_inv_freq=inv_freq.to(embed.device),
        rope_scaling=scaling,
    )


def weight_bytes(weights: TargetWeights) -> int:
    """Bytes of the tensors a decode step reads (layers, final norm, lm_head)."""
    total = weights.lm_head.numel() * weights.lm_head.element_size()
    total += weights.final_norm.numel() * weights.final_norm.element_size()
    for layer in weights.layers:
        total += sum(t.numel() * t.element_size() for t in layer if t is not None)
    return total
