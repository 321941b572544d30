"""The whole training-time test as one module `forward`, so DDP/FSDP hooks wrap all S steps at once."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from eaglewire.draft.model import Eagle3Draft
from eaglewire.train.loss import NUM_COUNTS, step_outcome, target_rank
from eaglewire.train.target_side import TrainInputs
from eaglewire.train.ttt import step_valid, ttt_unroll


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast for precision 'bf16', or 'auto' on CUDA; plain fp32 otherwise."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class ObjectiveOutput:
    loss_sums: torch.Tensor  # [S] summed per-row loss of each step (with grad)
    counts: torch.Tensor  # [S, NUM_COUNTS] float64 (see eaglewire.train.loss.COUNT_FIELDS)
    ranks: torch.Tensor | None  # [S, B, T] int64 rank of the target token among the draft's logits


class TTTObjective(nn.Module):
    """Holds the draft; forward unrolls `num_steps` TTT steps and scores each against the target."""

    def __init__(
        self, draft: Eagle3Draft, num_steps: int, kind: Literal["soft_ce", "kl"] = "soft_ce"
    ) -> None:
        super().__init__()
        self.draft = draft
        self.num_steps = num_steps
        self.kind: Literal["soft_ce", "kl"] = kind

    def forward(self, inputs: TrainInputs, with_ranks: bool = False) -> ObjectiveOutput:
        b = inputs.batch
        S = self.num_steps
        chain_ok = torch.ones_like(b.loss_mask)
        losses, counts, ranks = [], [], []
        steps = ttt_unroll(self.draft, b.input_ids, b.positions, b.doc_ids, inputs.aux, S)
        for s, out in enumerate(steps):
            target = inputs.target.shifted(1 + s)  # row t <- the target's distribution at t+1+s
            valid = step_valid(b.doc_ids, b.loss_mask, s)
            res = step_outcome(out.logits, target, valid, chain_ok, kind=self.kind)
            losses.append(res.loss_sum)
            counts.append(res.counts)
            if with_ranks:
                ranks.append(target_rank(out.logits.detach(), target))
            chain_ok = chain_ok & res.correct
        assert len(losses) == S
        return ObjectiveOutput(
            loss_sums=torch.stack(losses),
            counts=torch.stack(counts) if counts else torch.zeros(0, NUM_COUNTS, dtype=torch.float64),
            ranks=torch.stack(ranks) if with_ranks else None,
        )
