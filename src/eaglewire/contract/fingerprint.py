"""Fingerprints: a few numbers per captured tensor that prove, by values, which boundary it is.

Names and labels lie (the field reports' "embedding" was layer 2's output); values don't. A
fingerprint stores, for one fixed probe input, the per-token L2 norms and the leading channels
of the first tokens of every captured tensor. Any later stage recomputes all boundaries on a
live target and asks which one each stored tensor matches.

Pure math on torch tensors; no model code here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from eaglewire.typed_config import help_field

NormSide = Literal["pre", "post"]

LEADING_TOKENS = 4
LEADING_CHANNELS = 8
# Median per-token relative distance under which two fingerprints are "the same state", by the
# dtype of the runs compared (the looser of the two applies). Measured on SmolLM2-135M: adjacent
# boundaries >= 0.027 apart, float32-vs-bfloat16 noise <= 0.004.
TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 1e-2, "bfloat16": 1.5e-2}
EPS = 1e-6
# The probe: fixed text, tokenized with the target's own tokenizer; ids are stored with the fingerprint.
PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 1, 2, 3: def f(x): return x * 2"


@dataclass(frozen=True)
class StateKey:
    """Which physical state: a boundary, and for the last boundary whether after the final norm."""

    boundary: int
    norm: NormSide = "pre"

    def label(self) -> str:
        return f"boundary {self.boundary}" + (" (post-norm)" if self.norm == "post" else "")


@dataclass(frozen=True)
class TensorFingerprint:
    name: str = help_field("role of the tensor: 'aux[i]' (i-th aux state in concat order) or 'final'")
    boundary: int = help_field("boundary the tensor is declared to come from")
    norm: NormSide = help_field(
        "'pre' for the residual stream; 'post' only for the final state after the final norm"
    )
    token_norms: tuple[float, ...] = help_field("L2 norm of each probe token's vector, in float32")
    leading: tuple[float, ...] = help_field(
        f"first {LEADING_CHANNELS} channels of the first {LEADING_TOKENS} probe tokens, row-major"
    )

    @property
    def key(self) -> StateKey:
        return StateKey(self.boundary, self.norm)


@dataclass(frozen=True)
class Fingerprint:
    probe_ids: tuple[int, ...] = help_field("token ids of the probe input the statistics were taken on")
    dtype: str = help_field("dtype the target ran in when the fingerprint was taken")
    tensors: tuple[TensorFingerprint, ...] = help_field("one entry per captured tensor")


def summarize(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """[T, Ht] -> (per-token norms [T], leading values [LEADING_TOKENS * LEADING_CHANNELS])."""
    x = x.detach().float().cpu()
    norms = tuple(float(v) for v in x.norm(dim=-1))
    lead = x[:LEADING_TOKENS, :LEADING_CHANNELS].reshape(-1)
    return norms, tuple(float(v) for v in lead)


def fingerprint_tensor(name: str, key: StateKey, x: torch.Tensor) -> TensorFingerprint:
    norms, lead = summarize(x)
    return TensorFingerprint(name=name, boundary=key.boundary, norm=key.norm, token_norms=norms, leading=lead)


def distance(stored: TensorFingerprint, norms: Sequence[float], lead: Sequence[float]) -> float:
    """Median over tokens of the relative differences of per-token norms and leading-channel rows.

    Per token, then the median, so each token gets one vote: real targets carry "massive
    activations" on a few tokens (SmolLM2's first token has a residual norm ~25,000 against ~160),
    and a plain L2 over all tokens is dominated by that one token, whose vector barely changes
    between layers (adjacent SmolLM2 boundaries come out ~1% apart that way, below bf16 noise).
    """
    got_norms = torch.tensor(norms, dtype=torch.float64)
    ref_norms = torch.tensor(stored.token_norms, dtype=torch.float64)
    if got_norms.shape != ref_norms.shape or len(lead) != len(stored.leading):
        return float("inf")
    rel_norms = (got_norms - ref_norms).abs() / ref_norms.clamp_min(EPS)  # [T]
    got_lead = torch.tensor(lead, dtype=torch.float64).view(-1, LEADING_CHANNELS)
    ref_lead = torch.tensor(stored.leading, dtype=torch.float64).view(-1, LEADING_CHANNELS)
    rel_lead = (got_lead - ref_lead).norm(dim=-1) / ref_lead.norm(dim=-1).clamp_min(EPS)  # [LEADING_TOKENS]
    return float(torch.cat([rel_norms, rel_lead]).median())


def tolerance_for(*dtypes: str) -> float:
    """The looser tolerance of the dtypes of the runs being compared."""
    loosest = max(TOLERANCE.values())
    return max(TOLERANCE.get(d, loosest) for d in dtypes)


@dataclass(frozen=True)
class FingerprintMatch:
    name: str
    declared: StateKey
    best: StateKey
    best_distance: float
    declared_distance: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.best == self.declared and self.declared_distance <= self.tolerance

    def explain(self) -> str:
        if self.ok:
            return f"{self.name}: {self.declared.label()} confirmed (distance {self.declared_distance:.2e})"
        if self.best_distance <= self.tolerance:
            return (
                f"{self.name}: declared {self.declared.label()} but the values are {self.best.label()} "
                f"(distance {self.best_distance:.2e}; declared one is {self.declared_distance:.2e})"
            )
        return (
            f"{self.name}: declared {self.declared.label()} matches no boundary of this target "
            f"(closest {self.best.label()} at distance {self.best_distance:.2e} > tolerance {self.tolerance:.0e})"
        )


def match_fingerprint(
    fp: Fingerprint, states: Mapping[StateKey, torch.Tensor], *, live_dtype: str | None = None
) -> list[FingerprintMatch]:
    """For each stored tensor, find which recomputed state (`states`: key -> [T, Ht]) it matches.

    live_dtype: dtype the states were recomputed in (the tolerance is the looser of it and fp.dtype)."""
    tol = tolerance_for(fp.dtype, live_dtype or fp.dtype)
    summaries = {k: summarize(v) for k, v in states.items()}
    out = []
    for t in fp.tensors:
        dists = {k: distance(t, *s) for k, s in summaries.items()}
        best = min(dists, key=lambda k: dists[k])
        out.append(
            FingerprintMatch(
                name=t.name,
                declared=t.key,
                best=best,
                best_distance=dists[best],
                declared_distance=dists.get(t.key, float("inf")),
                tolerance=tol,
            )
        )
    return out
