"""Temperature / top-p processing and sampling, shared by verification, drafting and plain decoding.

temperature == 0 means greedy (argmax); everything else turns logits into the *processed*
distribution the target samples from. Speculative sampling is lossless with respect to exactly
this processed distribution, so verification and plain decoding must use the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglewire.errors import ConfigError
from eaglewire.typed_config import help_field


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = help_field("0 = greedy (argmax); > 0 divides the logits before softmax", default=0.0)
    top_p: float = help_field(
        "nucleus: keep the smallest set of tokens whose probability reaches top_p", default=1.0
    )
    seed: int = help_field("seed of the generator used for every random draw of one generation", default=0)

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ConfigError(f"temperature: expected >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p: expected 0 < top_p <= 1, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [..., V] -> renormalised probs keeping the smallest prefix (by probability) whose mass
    reaches top_p; the most likely token is always kept."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly more likely tokens
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> processed probabilities [..., V] float32 (temperature, then top-p).

    Greedy params give the one-hot distribution at the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    probs = torch.softmax(logits / params.temperature, dim=-1)
    return top_p_filter(probs, params.top_p)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from probs [V] (need not be normalised)."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Plain decoding's choice from logits [V]: argmax when greedy, else a processed-distribution draw."""
    if params.greedy:
        return int(logits.argmax().item())
    return sample_token(probs_from_logits(logits, params), generator)


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(params.seed)
    return g
