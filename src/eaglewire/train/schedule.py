"""AdamW over the draft's trainable parameters and the warmup + cosine learning-rate schedule.

The schedule is a pure function of the optimizer step, so its checkpointed state is just that
step (no pickled lambdas).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from eaglewire.train.config import TrainConfig


def warmup_steps(config: TrainConfig, total_steps: int) -> int:
    return math.ceil(config.warmup_ratio * total_steps)


def lr_at(step: int, total_steps: int, config: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup from 0, then cosine to min_lr_ratio."""
    peak = config.learning_rate
    warm = warmup_steps(config, total_steps)
    if step < warm:
        return peak * (step + 1) / warm
    span = max(1, total_steps - warm)
    progress = min(1.0, (step - warm) / span)
    floor = config.min_lr_ratio
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def build_optimizer(module: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    params = trainable_parameters(module)
    if not params:
        raise ValueError("no trainable parameters")
    return torch.optim.AdamW(
        params,
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
