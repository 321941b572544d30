"""Benchmark results: per-prompt runs, per-method aggregates, speedups, greedy-output comparison.

Aggregates over a method's prompts:

* tokens_per_s = sum(generated tokens) / sum(median seconds per prompt), prefill included, the
  same definition for every method (HF `generate` cannot separate its prefill);
* tau = sum(tau_i * verifications_i) / sum(verifications_i) (tokens per target verification,
  bonus included), per-position acceptance weighted the same way;
* decode_tokens_per_s = the same without each prompt's prefill (methods whose runs time their
  prefill: eaglewire's; None for transformers'), and decode_ms_per_forward = decode seconds per
  target forward (a verification round, or a plain decoding step);
* phases: seconds summed over prompts from each prompt's last timed run; `host` is that run's
  wall time minus the engine's timed phases (prefill, draft, verify, accept); `cycle_fraction`
  is each of draft / verify / accept / host over their sum (one speculative cycle, prefill excluded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# What explains a greedy mismatch (`Mismatch.cause`; `eaglewire.bench.divergence` decides it). Here,
# beside Mismatch, so that divergence depends on this module and not the other way round.
Cause = Literal["rounding", "this method", "the reference"]
CYCLE_PHASES = ("draft", "verify", "accept", "host")
ENGINE_PHASES = ("prefill", "draft", "verify", "accept")


@dataclass
class PromptRun:
    prompt_id: str
    prompt_tokens: int
    token_ids: list[int]
    seconds: float  # median over repeats
    all_seconds: list[float]
    text: str = ""
    finish_reason: str = ""
    tau: float | None = None
    num_verifications: int = 0
    per_position_acceptance: list[float] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # the last timed run's
    accepted_per_round: list[int] = field(default_factory=list)  # the last timed run's (speculative only)
    emitted_per_round: list[int] = field(default_factory=list)  # its tokens per round, the last past the stop
    accepted_paths: list[list[int]] = field(
        default_factory=list
    )  # its tree nodes accepted per round, root first
    category: str = ""  # the prompt's category (MT-bench's writing, math, ...), "" when it has none

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    def host_seconds(self) -> float | None:
        """Last timed run's wall time not covered by the engine's own phases (speculative runs only)."""
        if not any(k in self.phase_seconds for k in ("draft", "verify")):
            return None
        covered = sum(self.phase_seconds.get(k, 0.0) for k in ENGINE_PHASES)
        return max(self.all_seconds[-1] - covered, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "all_seconds": self.all_seconds,
            "tokens_per_s": self.new_tokens / self.seconds if self.seconds > 0 else None,
            "tau": self.tau,
            "num_verifications": self.num_verifications,
            "per_position_acceptance": self.per_position_acceptance,
            "phase_seconds": self.phase_seconds,
            "accepted_per_round": self.accepted_per_round,
            "emitted_per_round": self.emitted_per_round,
            "accepted_paths": self.accepted_paths,
            "finish_reason": self.finish_reason,
            "category": self.category,
            "text": self.text,
            "token_ids": self.token_ids,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PromptRun:
        """The run `to_json` wrote (its derived keys, new_tokens and tokens_per_s, are recomputed)."""
        return cls(
            prompt_id=str(data["prompt_id"]),
            prompt_tokens=int(data["prompt_tokens"]),
            token_ids=[int(t) for t in data["token_ids"]],
            seconds=float(data["seconds"]),
            all_seconds=[float(x) for x in data["all_seconds"]],
            text=str(data.get("text", "")),
            finish_reason=str(data.get("finish_reason", "")),
            tau=None if data.get("tau") is None else float(data["tau"]),
            num_verifications=int(data.get("num_verifications", 0)),
            per_position_acceptance=[float(x) for x in data.get("per_position_acceptance", [])],
            phase_seconds={str(k): float(v) for k, v in data.get("phase_seconds", {}).items()},
            accepted_per_round=[int(x) for x in data.get("accepted_per_round", [])],
            emitted_per_round=[int(x) for x in data.get("emitted_per_round", [])],
            accepted_paths=[[int(x) for x in p] for p in data.get("accepted_paths", [])],
            category=str(data.get("category", "")),
        )


def pooled_tau(runs: Sequence[PromptRun]) -> float | None:
    """Tokens emitted per verification over `runs` (each prompt's tau weighted by its verifications)."""
    spec = [r for r in runs if r.tau is not None]
    total = sum(r.num_verifications for r in spec)
    if not spec or total == 0:
        return None
    return sum(r.tau * r.num_verifications for r in spec if r.tau is not None) / total


@dataclass
class Mismatch:
    prompt_id: str
    position: int  # first differing generated token
    token: int | None  # this method's token there (None: its output ended)
    reference_token: int | None
    # the target's logit(reference_token) - logit(token) there (eaglewire.bench.divergence); None: not measured
    margin: float | None = None
    # what explains the margin in the run's dtype (divergence.cause_of): "rounding", "this method"
    # (a bug in it) or "the reference" (plain's decode drifted from the target's forward); None: not measured
    cause: Cause | None = None

    def to_json(self) -> dict[str, Any]:
        return {"prompt_id": self.prompt_id, "position": self.position, "token": self.token,
                "reference_token": self.reference_token, "margin": self.margin,
                "cause": self.cause}  # fmt: skip


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or where the shorter ends); None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(runs: Sequence[PromptRun], reference: Sequence[PromptRun]) -> list[Mismatch]:
    """Greedy outputs of a method against the reference method's, prompt by prompt (same order)."""
    out = []
    for run, ref in zip(runs, reference, strict=True):
        pos = first_difference(run.token_ids, ref.token_ids)
        if pos is not None:
            tok = run.token_ids[pos] if pos < len(run.token_ids) else None
            want = ref.token_ids[pos] if pos < len(ref.token_ids) else None
            out.append(Mismatch(run.prompt_id, pos, tok, want))
    return out


@dataclass
class MethodResult:
    method: str
    available: bool
    reason: str = ""  # why not available
    settings: dict[str, Any] = field(default_factory=dict)
    runs: list[PromptRun] = field(default_factory=list)
    mismatches: list[Mismatch] | None = None  # None: not compared
    speedup_vs_plain: float | None = None
    speedup_vs_hf_generate: float | None = None
    decode_speedup_vs_plain: float | None = None

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.runs)

    @property
    def decode_seconds(self) -> float | None:
        """Seconds without the prefill, summed over prompts; None unless every run timed its prefill."""
        if not self.runs or not all("prefill" in r.phase_seconds for r in self.runs):
            return None
        return sum(max(r.seconds - r.phase_seconds["prefill"], 0.0) for r in self.runs)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Generated tokens per second of decoding alone (the prefill's first token included)."""
        dec = self.decode_seconds
        return self.new_tokens / dec if dec else None

    @property
    def decode_ms_per_forward(self) -> float | None:
        """Decode milliseconds per target forward: per verification round (speculative), or per
        decoding step (plain; a prompt's first token comes from its prefill)."""
        dec = self.decode_seconds
        forwards = self.num_verifications or self.new_tokens - len(self.runs)
        return dec * 1e3 / forwards if dec and forwards > 0 else None

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.seconds if self.runs and self.seconds > 0 else None

    @property
    def num_verifications(self) -> int:
        return sum(r.num_verifications for r in self.runs)

    @property
    def tau(self) -> float | None:
        return pooled_tau(self.runs)

    @property
    def tau_by_category(self) -> dict[str, float]:
        """tau pooled over each prompt category's runs, categories in first-seen order; empty when the
        prompts have no categories or the method does not speculate."""
        cats = list(dict.fromkeys(r.category for r in self.runs if r.category))
        pooled = {c: pooled_tau([r for r in self.runs if r.category == c]) for c in cats}
        return {c: t for c, t in pooled.items() if t is not None}

    @property
    def per_position_acceptance(self) -> list[float]:
        spec = [r for r in self.runs if r.per_position_acceptance and r.num_verifications]
        total = sum(r.num_verifications for r in spec)
        if not spec:
            return []
        width = max(len(r.per_position_acceptance) for r in spec)
        return [
            sum(
                r.per_position_acceptance[k] * r.num_verifications
                for r in spec
                if k < len(r.per_position_acceptance)
            )
            / total
            for k in range(width)
        ]

    @property
    def phase_seconds(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for r in self.runs:
            for k, v in r.phase_seconds.items():
                totals[k] = totals.get(k, 0.0) + v
            host = r.host_seconds()
            if host is not None:
                totals["host"] = totals.get("host", 0.0) + host
        return totals

    @property
    def cycle_fraction(self) -> dict[str, float]:
        """draft / verify / accept / host as fractions of their sum (empty for non-speculative methods)."""
        phases = self.phase_seconds
        if "verify" not in phases:
            return {}
        total = sum(phases.get(k, 0.0) for k in CYCLE_PHASES)
        return {k: phases.get(k, 0.0) / total for k in CYCLE_PHASES} if total > 0 else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "available": self.available,
            "reason": self.reason,
            "settings": self.settings,
            "num_prompts": len(self.runs),
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "speedup_vs_plain": self.speedup_vs_plain,
            "speedup_vs_hf_generate": self.speedup_vs_hf_generate,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "decode_speedup_vs_plain": self.decode_speedup_vs_plain,
            "decode_ms_per_forward": self.decode_ms_per_forward,
            "tau": self.tau,
            "tau_by_category": self.tau_by_category,
            "num_verifications": self.num_verifications,
            "per_position_acceptance": self.per_position_acceptance,
            "phase_seconds": self.phase_seconds,
            "cycle_fraction": self.cycle_fraction,
            "greedy_matches_reference": None if self.mismatches is None else not self.mismatches,
            "greedy_mismatches": None if self.mismatches is None else [m.to_json() for m in self.mismatches],
            "prompts": [r.to_json() for r in self.runs],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MethodResult:
        """What `to_json` wrote of the measurement itself; comparisons (speedups, mismatches) are
        left to be filled again against this run's references."""
        return cls(
            method=str(data["method"]),
            available=bool(data["available"]),
            reason=str(data.get("reason", "")),
            settings=dict(data.get("settings", {})),
            runs=[PromptRun.from_json(r) for r in data.get("prompts", [])],
        )


def fill_comparisons(results: dict[str, MethodResult], reference: str | None) -> None:
    """Speedups against `plain` and `hf-generate` (when they ran) and greedy mismatches against `reference`."""

    def tps(name: str) -> float | None:
        r = results.get(name)
        return r.tokens_per_s if r is not None and r.available else None

    plain, hf = tps("plain"), tps("hf-generate")
    ref = results.get(reference) if reference else None
    for r in results.values():
        if not r.available or r.tokens_per_s is None:
            continue
        r.speedup_vs_plain = r.tokens_per_s / plain if plain else None
        r.speedup_vs_hf_generate = r.tokens_per_s / hf if hf else None
        plain_decode = results["plain"].decode_tokens_per_s if tps("plain") is not None else None
        mine = r.decode_tokens_per_s
        r.decode_speedup_vs_plain = mine / plain_decode if mine and plain_decode else None
        if ref is not None and ref.available and r is not ref:
            r.mismatches = compare_outputs(r.runs, ref.runs)
