"""Distances that tell adjacent boundaries apart on real models, robust to attention-sink tokens.

Real targets carry "massive activations" on a few tokens (SmolLM2-135M's first token has a
residual norm ~25,000 against ~160 for the others from boundary 3 on). A plain L2 distance over
all tokens is then dominated by that one token, whose vector barely changes from layer to layer:
mid boundaries of SmolLM2 come out ~1% apart, less than bfloat16-vs-float32 noise (measured:
adjacent boundaries 12..28 at 0.009 relative, noise up to 0.044). Taking the distance per token
and then the median over tokens gives each token one vote: adjacent boundaries are >= 0.22 apart
and cross-dtype noise <= 0.024 on the same model (ratio ~15, float32 vs bfloat16, 41 tokens).

The contract's fingerprint uses the same idea (`eaglewire.contract.fingerprint.distance`).
"""

from __future__ import annotations

import torch

EPS = 1e-6
# Median per-token distance of whole state vectors under which two captures are "the same state",
# by the dtype of the runs compared. bf16 noise grows with depth (SmolLM2 boundary 27, bf16 vs
# float32: 0.025); adjacent boundaries stay >= 0.22 apart.
STATE_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 3e-2, "bfloat16": 6e-2}


def state_distance(x: torch.Tensor, ref: torch.Tensor) -> float:
    """x, ref [T, Ht] -> median over tokens of ||x_t - ref_t|| / ||ref_t|| (float32)."""
    x32, r32 = x.float(), ref.float()
    per_token = (x32 - r32).norm(dim=-1) / r32.norm(dim=-1).clamp_min(EPS)  # [T]
    return float(per_token.median())
