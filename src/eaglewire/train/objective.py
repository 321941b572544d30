"""The whole training-time test as one module `forward`, so DDP/FSDP hooks wrap all S steps at once."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from eaglewire.draft.model import DraftOutput, Eagle3Draft
from eaglewire.errors import ConfigError
from eaglewire.nn.attention import varying_shape_attention
from eaglewire.train.batches import Batch
from eaglewire.train.config import TTTAttention
from eaglewire.train.loss import NUM_COUNTS, in_top_k, step_outcome, stored_rank
from eaglewire.train.target_side import TrainInputs
from eaglewire.train.ttt import StepRows, step_rows, ttt_unroll


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast for precision 'bf16', or 'auto' on CUDA; plain fp32 otherwise."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batch_step_rows(batch: Batch, num_steps: int) -> StepRows:
    """The batch's StepRows, planned from its host copy (no device sync) and placed beside it."""
    host = batch.host if batch.host is not None else batch
    return step_rows(host.doc_ids, host.loss_mask, num_steps, batch.doc_ids.device)


@dataclass
class ObjectiveOutput:
    loss_sums: torch.Tensor  # [S] summed per-row loss of each step (with grad)
    counts: torch.Tensor  # [S, NUM_COUNTS] float64 (see eaglewire.train.loss.COUNT_FIELDS)
    ranks: torch.Tensor | None  # [S, B, T] int64 `stored_rank` of the target token among the draft's logits


# torch.compile's backend for `TTTObjective(compile=True)` (tests without a C++ toolchain swap it)
COMPILE_BACKEND = "inductor"


class TTTObjective(nn.Module):
    """Holds the draft; forward unrolls `num_steps` TTT steps and scores each against the target.
    compile=True runs the draft's forward through torch.compile with dynamic shapes (one graph per
    TTT step, as the chain's key count differs; no graph breaks)."""

    def __init__(
        self,
        draft: Eagle3Draft,
        num_steps: int,
        kind: Literal["soft_ce", "kl"] = "soft_ce",
        *,
        hard_label_weight: float = 0.0,
        align_topk: int = 0,
        compile: bool = False,
        attention: TTTAttention = "blocked",
    ) -> None:
        super().__init__()
        device = next(draft.parameters()).device
        if attention == "flex" and device.type != "cuda":
            raise ConfigError(
                f"ttt_attention='flex' needs the draft on a CUDA device (FlexAttention has no CPU "
                f"backward); the draft is on {device}",
                fix="ttt_attention='blocked' (the default) off CUDA",
            )
        self.attention: TTTAttention = attention
        self.draft = draft
        self.num_steps = num_steps
        self.kind: Literal["soft_ce", "kl"] = kind
        self.hard_label_weight = hard_label_weight
        self.align_topk = align_topk  # TrainConfig.align_topk: 0 = train every valid row
        self._forward: Callable[..., DraftOutput] | None = (
            torch.compile(draft.forward, dynamic=True, backend=COMPILE_BACKEND) if compile else None
        )

    def forward(
        self, inputs: TrainInputs, with_ranks: bool = False, rows: StepRows | None = None
    ) -> ObjectiveOutput:
        """rows: the batch's `StepRows` for `num_steps` (built here from the batch when None)."""
        b = inputs.batch
        S = self.num_steps
        if rows is None:
            rows = batch_step_rows(b, S)
        if rows.num_steps != S:
            raise ValueError(f"StepRows for {rows.num_steps} steps, the objective unrolls {S}")
        chain_ok = torch.ones_like(b.loss_mask)  # [B, T] every earlier step's top-1 right
        aligned = torch.ones_like(b.loss_mask)  # [B, T] every earlier step's top-k right (align_topk)
        losses, counts, ranks = [], [], []
        B, T = b.input_ids.shape
        # Ranks need every row's logits; otherwise only the rows each step scores get the lm_head.
        steps = ttt_unroll(
            self.draft,
            b.input_ids,
            b.positions,
            b.doc_ids,
            inputs.aux,
            S,
            logits=with_ranks,
            forward=self._forward,
            attention=self.attention,
        )
        with varying_shape_attention():  # every batch has its own length: no per-shape cuDNN plans
            for s, out in enumerate(steps):
                target = inputs.target.shifted(1 + s)  # row t <- the target's distribution at t+1+s
                if with_ranks:
                    logits, scored = out.logits, None  # [B, T, Vd]
                else:
                    scored = rows.scored[s]
                    logits = self.draft.compute_logits(out.hidden.reshape(B * T, -1)[scored])  # [M, Vd]
                res = step_outcome(
                    logits,
                    target,
                    rows.valid[s],
                    chain_ok,
                    kind=self.kind,
                    hard_label_weight=self.hard_label_weight,
                    rows=rows.index[s],
                    scored=scored,
                    trained=aligned if self.align_topk else None,
                )
                losses.append(res.loss_sum)
                counts.append(res.counts)
                if with_ranks:
                    ranks.append(stored_rank(out.logits.detach(), target))
                chain_ok = chain_ok & res.correct
                if self.align_topk > 1:
                    aligned = aligned & in_top_k(logits, target, self.align_topk, scored, chain_ok.shape)
                elif self.align_topk == 1:
                    aligned = chain_ok
        assert len(losses) == S
        return ObjectiveOutput(
            loss_sums=torch.stack(losses),
            counts=torch.stack(counts) if counts else torch.zeros(0, NUM_COUNTS, dtype=torch.float64),
            ranks=torch.stack(ranks) if with_ranks else None,
        )
