"""AdamW over the draft's trainable parameters and the warmup + cosine learning-rate schedule.

The schedule is a pure function of the optimizer step and, when the run has a wall-time budget
(`max_seconds` > 0), of the fraction of that budget used so far; its checkpointed state is just
those two numbers (no pickled lambdas).

Why the clock: the cosine is laid out over the optimizer steps the epochs make. A budget that ends
the run after a third of them would otherwise stop it at a high learning rate (an unconverged
draft). With a budget the schedule runs on whichever clock is further along: warmup ends after
`warmup_ratio` of the steps *or* of the budget, and the cosine reaches its floor at the last step
*or* when the budget runs out. Without a budget it is exactly the step schedule.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from eaglewire.train.config import TrainConfig


def warmup_steps(config: TrainConfig, total_steps: int) -> int:
    return math.ceil(config.warmup_ratio * total_steps)


def lr_at(step: int, total_steps: int, config: TrainConfig, *, time_fraction: float = 0.0) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup from 0, then cosine to min_lr_ratio.

    time_fraction: training time so far / `max_seconds` (0 when there is no budget). Progress is the
    larger of the step-based and the time-based one (see the module docstring); with 0 the result is
    the step schedule, bit for bit.
    """
    peak = config.learning_rate
    warm = warmup_steps(config, total_steps)
    ratio = config.warmup_ratio
    clock = min(max(time_fraction, 0.0), 1.0)
    clock_warm = clock / ratio if ratio > 0 else 1.0  # share of the warmup the clock has done
    if step < warm and clock_warm < 1.0:
        return max(peak * (step + 1) / warm, peak * clock_warm)
    span = max(1, total_steps - warm)
    clock_progress = (clock - ratio) / (1.0 - ratio)  # < 0 while the clock is still in its warmup
    progress = min(1.0, max((step - warm) / span, clock_progress, 0.0))
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
