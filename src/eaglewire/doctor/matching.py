"""Distances that tell adjacent boundaries apart on real models, robust to attention-sink tokens.

Real targets carry "massive activations" on a few tokens (SmolLM2-135M's first token has a
residual norm ~25,000 against ~160 for the others from boundary 3 on). A plain L2 distance over
all tokens is then dominated by that one token, whose vector barely changes from layer to layer:
mid boundaries of SmolLM2 come out ~1% apart, less than bfloat16-vs-float32 noise (measured:
adjacent boundaries 12..28 at 0.009 relative, noise up to 0.044). Taking the distance per token
and then the median over tokens gives each token one vote: adjacent boundaries are >= 0.22 apart
and cross-dtype noise <= 0.024 on the same model (ratio ~15, float32 vs bfloat16, 41 tokens).

The same holds for the contract's fingerprint (per-token norms and the leading channels of the
first tokens): compared per token and medianed, adjacent SmolLM2 boundaries are >= 0.027 apart
and cross-dtype noise <= 0.004.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from eaglewire.contract.fingerprint import (
    LEADING_CHANNELS,
    Fingerprint,
    StateKey,
    TensorFingerprint,
    summarize,
)

EPS = 1e-6
# Median-per-token distance under which a fingerprint is "the same state", by dtype of the runs compared.
FINGERPRINT_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 1e-2, "bfloat16": 1.5e-2}


def state_distance(x: torch.Tensor, ref: torch.Tensor) -> float:
    """x, ref [T, Ht] -> median over tokens of ||x_t - ref_t|| / ||ref_t|| (float32)."""
    x32, r32 = x.float(), ref.float()
    per_token = (x32 - r32).norm(dim=-1) / r32.norm(dim=-1).clamp_min(EPS)  # [T]
    return float(per_token.median())


def fingerprint_distance(
    stored: TensorFingerprint, norms: tuple[float, ...], lead: tuple[float, ...]
) -> float:
    """Median over the per-token relative differences of the norms and of the leading-channel rows."""
    a_norms, b_norms = (
        torch.tensor(norms, dtype=torch.float64),
        torch.tensor(stored.token_norms, dtype=torch.float64),
    )
    if a_norms.shape != b_norms.shape or len(lead) != len(stored.leading):
        return float("inf")
    rel_norms = (a_norms - b_norms).abs() / b_norms.clamp_min(EPS)  # [T]
    a_lead = torch.tensor(lead, dtype=torch.float64).view(-1, LEADING_CHANNELS)
    b_lead = torch.tensor(stored.leading, dtype=torch.float64).view(-1, LEADING_CHANNELS)
    rel_lead = (a_lead - b_lead).norm(dim=-1) / b_lead.norm(dim=-1).clamp_min(EPS)  # [LEADING_TOKENS]
    return float(torch.cat([rel_norms, rel_lead]).median())


@dataclass(frozen=True)
class FingerprintMatch:
    name: str
    declared: StateKey
    best: StateKey
    best_distance: float
    declared_distance: float


def match_fingerprint_robust(
    fp: Fingerprint, states: Mapping[StateKey, torch.Tensor]
) -> list[FingerprintMatch]:
    """For each stored tensor of `fp`, the recomputed state (key -> [T, Ht]) it is closest to."""
    summaries = {k: summarize(v) for k, v in states.items()}
    out = []
    for t in fp.tensors:
        dists = {k: fingerprint_distance(t, *s) for k, s in summaries.items()}
        best = min(dists, key=lambda k: dists[k])
        out.append(FingerprintMatch(t.name, t.key, best, dists[best], dists.get(t.key, float("inf"))))
    return out
