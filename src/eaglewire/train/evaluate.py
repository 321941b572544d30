"""Held-out evaluation as training runs it: per-step accuracy and, when asked, every position's draft rank.

Runs the same training-time-test forward as training (ground-truth tokens, the draft's own hidden
states, serving positions and masks) and records, for every position t and step s, the rank of
the target's argmax token among the draft's logits (0 = the draft's top-1 is that token). The
training loop evaluates with counts only; `eaglewire.predict.evaluation` keeps the ranks and
replays decoding over them to predict the acceptance length (tau).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from eaglewire.train.batches import RecordSource, Row, fetch_rows, plan_rows, record_lengths
from eaglewire.train.distributed import DistContext, all_gather_objects, all_reduce_sum
from eaglewire.train.loss import StepCounts
from eaglewire.train.target_side import TargetSide
from eaglewire.train.ttt import step_in_range, step_valid


@dataclass
class EvalRanks:
    """What one evaluation measured: the per-step count table and, with ranks kept, per-position ranks."""

    counts: StepCounts
    step_weights: list[float]
    # [N, S] int16 (`loss.stored_rank`), positions in range at step 0, record slices back to back
    ranks: torch.Tensor
    valid: torch.Tensor  # [N, S] bool
    records: int
    tokens: int
    segments: tuple[int, ...] | None = None  # rows of `ranks` per record slice, in order; None: one slice

    @property
    def num_steps(self) -> int:
        return int(self.counts.table.shape[0])

    @property
    def has_positions(self) -> bool:
        """Whether per-position ranks were kept (`with_ranks`), which replay and trees need."""
        return self.ranks.shape[0] > 0 or not any(self.counts.column("valid"))

    def summary(self) -> dict[str, Any]:
        """The count-table metrics (loss, accuracy, conditional accuracy per step), records and tokens."""
        return {**self.counts.summary(self.step_weights), "records": self.records, "tokens": self.tokens}


def eval_rows(data: RecordSource[Any], *, max_length: int, pack: bool, max_records: int) -> list[Row]:
    """Held-out rows in record order (no shuffling), at most `max_records` records. Packed next-fit
    (one open row), so the rows' slots stay in record order, which the replay reads them back in."""
    lengths = record_lengths(data)
    n = len(lengths) if max_records <= 0 else min(max_records, len(lengths))
    return plan_rows(lengths, list(range(n)), max_length=max_length, pack=pack, open_rows=1)


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    target_side: TargetSide,
    data: RecordSource[Any],
    rows: Sequence[Row],
    *,
    ctx: DistContext,
    batch_size: int,
    num_steps: int,
    step_weights: list[float],
    autocast: AbstractContextManager[Any],
    with_ranks: bool = True,
) -> EvalRanks:
    """Evaluate a TTTObjective (possibly DDP/FSDP-wrapped) on `rows`; all processes must call this.

    Batches are dealt round-robin over processes; every process runs the same number of forwards
    (a process with nothing left repeats batch 0 and discards it), which FSDP's collectives need.
    """
    batches = [list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]
    counts = StepCounts(num_steps, device=ctx.device)
    rank_parts: list[torch.Tensor] = []
    valid_parts: list[torch.Tensor] = []
    segments: list[int] = []  # step-0 rows of each record slice, in the order of rank_parts
    tokens = torch.zeros((), dtype=torch.float64, device=ctx.device)
    rounds = math.ceil(len(batches) / ctx.world_size) if batches else 0
    was_training = model.training
    model.eval()
    for r in range(rounds):
        idx = r * ctx.world_size + ctx.rank
        real = idx < len(batches)
        part = batches[idx] if real else batches[0]
        inputs = target_side.prepare(part, fetch_rows(data, part), ctx.device)
        with autocast:
            out = model(inputs, with_ranks=with_ranks)
        if not real:
            continue
        counts.table += out.counts
        b = inputs.batch
        tokens += b.num_tokens
        if with_ranks and out.ranks is not None:
            keep = step_in_range(b.doc_ids, 0)  # [B, T]
            rank_parts.append(out.ranks[:, keep].T.to(torch.int16).cpu())  # [N, S], `stored_rank`
            valid = torch.stack(
                [step_valid(b.doc_ids, b.loss_mask, s) for s in range(num_steps)]
            )  # [S, B, T]
            valid_parts.append(valid[:, keep].T.cpu())
            host = b.host if b.host is not None else b
            host_ids = host.doc_ids.cpu()
            host_keep = step_in_range(host_ids, 0)  # [B, T], as `keep`
            for ids, row_keep in zip(host_ids, host_keep, strict=True):  # record slices of each row
                _, sizes = torch.unique_consecutive(ids[row_keep], return_counts=True)
                segments.extend(int(n) for n in sizes)
    model.train(was_training)
    all_reduce_sum(counts.table, ctx)
    all_reduce_sum(tokens, ctx)
    ranks = torch.cat(rank_parts) if rank_parts else torch.zeros(0, num_steps, dtype=torch.int16)
    valid_t = torch.cat(valid_parts) if valid_parts else torch.zeros(0, num_steps, dtype=torch.bool)
    if with_ranks and ctx.distributed:
        ranks = torch.cat(all_gather_objects(ranks, ctx))
        valid_t = torch.cat(all_gather_objects(valid_t, ctx))
        segments = [n for part in all_gather_objects(segments, ctx) for n in part]
    num_records = sum(len(row) for row in rows)
    return EvalRanks(counts, step_weights, ranks, valid_t, num_records, int(tokens), tuple(segments))
