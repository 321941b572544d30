"""Batched plain generation for regeneration and Magpie prompts: one function picks the backend.

`pick_generate_fn` returns the engine's batched plain generation over one reused runner;
`hf_generate` is transformers' `generate` with left padding. Both have the signature of
`GenerateFn` (called positionally); switching backends is the one line in `pick_generate_fn`. A backend may also have `reserve(max_batch_size, max_seq_len)`
(the engine's `ReusedRunnerGenerate` does): callers that know their largest batch and prompt +
new tokens call it first, so the backend sizes its runner once instead of rebuilding it as calls grow.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from eaglewire.errors import ConfigError
from eaglewire.target.loading import LoadedTarget
from eaglewire.typed_config import help_field

log = logging.getLogger(__name__)


class GenerateFn(Protocol):
    def __call__(
        self,
        runner_or_target: Any,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        eos_token_ids: list[int],
        /,
    ) -> list[list[int]]: ...


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = help_field("most tokens generated per answer", default=512)
    temperature: float = help_field("sampling temperature; 0 = greedy", default=0.7)
    top_p: float = help_field("nucleus sampling threshold in (0, 1]", default=0.95)
    seed: int = help_field(
        "base seed; each batch derives its own from it, so reruns are identical", default=0
    )
    batch_size: int = help_field("conversations generated together", default=16)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens: expected >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature: expected >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: expected in (0, 1], got {self.top_p}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size: expected >= 1, got {self.batch_size}")


def hf_generate(
    runner_or_target: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    eos_token_ids: list[int],
) -> list[list[int]]:
    """transformers `generate` on a left-padded batch. prompts: B lists of ids -> B lists of new ids."""
    from transformers import GenerationConfig

    target: LoadedTarget = runner_or_target
    model = target.model
    pad_id = getattr(target.tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = eos_token_ids[0]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, T] left-padded
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    sampling = temperature > 0
    gen_cfg = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sampling,
        temperature=temperature if sampling else None,
        top_p=top_p if sampling else None,
        top_k=None,
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_id,
    )
    device = target.device
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(  # type: ignore[operator]
            input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen_cfg
        )
    return [row.tolist() for row in out[:, width:].cpu()]


def pick_generate_fn(*, continuous: bool = False, max_rows: int = 0) -> GenerateFn:
    """The engine's batched plain generation over one runner kept for every call (`hf_generate`,
    transformers' generate, has the same signature). continuous: the engine refills rows as answers
    finish instead of running each batch to its end. max_rows: the most rows one forward runs (0 =
    the engine's DEFAULT_MAX_BATCH)."""
    from eaglewire.engine.plain import DEFAULT_MAX_BATCH
    from eaglewire.engine.reused_runner import ReusedRunnerGenerate

    if max_rows < 0:
        raise ConfigError(
            f"pick_generate_fn: max_rows must be >= 0 (0 = {DEFAULT_MAX_BATCH}), got {max_rows}"
        )
    return ReusedRunnerGenerate(max_rows or DEFAULT_MAX_BATCH, continuous=continuous)


def eos_ids(target: LoadedTarget) -> list[int]:
    """The target's end-of-turn ids; generation without any is refused (it could never stop)."""
    ids = list(target.eos_token_ids)
    if not ids:
        raise ConfigError(
            f"target {target.path}: no eos token in its tokenizer, config or generation config; generation cannot stop",
            fix="set eos_token in the tokenizer config",
        )
    return ids


def cut_at_eos(tokens: list[int], eos: Sequence[int]) -> tuple[list[int], str]:
    """Tokens before the first eos, and the finish reason: 'stop' (eos seen) or 'length'."""
    eos_set = set(eos)
    for i, t in enumerate(tokens):
        if t in eos_set:
            return tokens[:i], "stop"
    return tokens, "length"


def generate_answers(
    target: LoadedTarget,
    prompts: list[list[int]],
    cfg: SamplingConfig,
    seed: int,
    *,
    generate_fn: GenerateFn | None = None,
) -> list[tuple[list[int], str]]:
    """Generate for one batch; returns (new ids without eos, finish reason) per prompt."""
    fn = generate_fn or pick_generate_fn()
    eos = eos_ids(target)
    outs = fn(target, prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_p, seed, eos)
    if len(outs) != len(prompts):
        raise RuntimeError(f"generation returned {len(outs)} sequences for {len(prompts)} prompts")
    return [cut_at_eos(list(o)[: cfg.max_new_tokens], eos) for o in outs]
