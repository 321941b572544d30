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
# Relative distance under which two fingerprints are "the same tensor". bf16 captures from two
# devices (or two kernels) differ by ~1e-2; adjacent boundaries differ by far more.
TOLERANCE = {"float32": 2e-3, "float64": 1e-6, "bfloat16": 4e-2, "float16": 2e-2}
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
    norm: NormSide = help_field("'pre' for the residual stream; 'post' only for the final state after the final norm")
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


def distance(a: TensorFingerprint, norms: Sequence[float], lead: Sequence[float]) -> float:
    """Relative L2 distance between a stored fingerprint and recomputed summaries."""
    ref = torch.tensor([*a.token_norms, *a.leading], dtype=torch.float64)
    got = torch.tensor([*norms, *lead], dtype=torch.float64)
    if ref.shape != got.shape:
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-12))


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


def match_fingerprint(fp: Fingerprint, states: Mapping[StateKey, torch.Tensor]) -> list[FingerprintMatch]:
    """For each stored tensor, find which recomputed state (`states`: key -> [T, Ht]) it matches."""
    tol = TOLERANCE.get(fp.dtype, TOLERANCE["bfloat16"])
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
