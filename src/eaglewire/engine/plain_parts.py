"""What plain decoding's two loops share: the batch loop (`plain`) and continuous batching
(`continuous`) both right-pad prompts, sample the next tokens the same way, split prefills by the
same token budget and report the same result record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PREFILL_TOKEN_BUDGET = 16384  # tokens per prefill forward (B * chunk width)


@dataclass
class PlainResult:
    tokens: list[list[int]]  # generated ids per prompt, in prompt order
    prompt_tokens: int
    new_tokens: int
    prefill_seconds: float
    decode_seconds: float
    forwards: int  # decode forwards run (all batches)
    graphs_captured: int = 0  # CUDA graphs the runner captured during this call
    graph_capture_seconds: float = 0.0  # seconds those captures took (compilation included)

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second, prefill included."""
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """logits [B, V] float32 -> next ids [B]. temperature 0 = argmax; else softmax(logits/T),
    restricted to the smallest top-p nucleus, sampled by the exponential race (no host sync)."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p  # mass before this token
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    race = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / race).argmax(dim=-1)


def right_padded(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """prompts -> (ids [B, T] right-padded with 0, lengths [B]) on the host; T = the longest."""
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    ids = torch.zeros(len(prompts), int(lens.max()), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p, dtype=torch.long)
    return ids, lens
