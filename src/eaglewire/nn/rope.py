"""Rotary position embeddings from a Hugging Face `rope_parameters` dict (default, llama3, yarn, ...).

Non-default RoPE types reuse transformers' own init functions, so scaling rules are not copied.
"""

from __future__ import annotations

from typing import Any

import torch


def rope_inv_freq(
    rope_parameters: dict[str, Any], head_dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2], attention_scaling) for these rope parameters."""
    rope_type = rope_parameters.get("rope_type", "default")
    base = float(rope_parameters["rope_theta"])
    if rope_type == "default":
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        return inv_freq, 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](cfg, None)
    return inv_freq.float(), float(scaling)


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> cos, sin [B, 1, T, head_dim] (computed in float32)."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)  # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, hd]
    return (emb.cos() * scaling).to(dtype)[:, None], (emb.sin() * scaling).to(dtype)[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, hd]."""
    return x * cos + rotate_half(x) * sin
