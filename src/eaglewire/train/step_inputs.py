"""One optimizer step's inputs on this process, and which step comes after it.

The loop prepares step i+1's inputs inside step i, before that step's one host sync, so the host's
record work and the target's forwards overlap the device's work on step i (`train.loop`).
`StepInputs` remembers which (epoch, group) it holds, so the loop can check it got the step it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eaglewire.train.batches import RecordSource, Row, fetch_rows, split_for_rank
from eaglewire.train.config import TrainConfig
from eaglewire.train.distributed import DistContext
from eaglewire.train.objective import batch_step_rows
from eaglewire.train.target_side import TargetSide, TrainInputs
from eaglewire.train.ttt import StepRows


@dataclass
class StepInputs:
    """Group `group` of epoch `epoch`, as this process runs it."""

    epoch: int
    group: int
    micro: list[list[Row]]  # the micro-batches' rows
    inputs: list[TrainInputs]
    plans: list[StepRows]
    # The first `real` micro-batches hold this process's rows; the rest are fillers that only keep
    # the processes' collectives in step (weight zero, counted nowhere).
    real: int

    @property
    def record_ids(self) -> list[str]:
        """The records this process trains on in this step (fillers excluded), in row order."""
        return [rid for inp in self.inputs[: self.real] for rid in inp.batch.record_ids]


def prepare_step(
    groups: Sequence[list[Row]],
    epoch: int,
    index: int,
    *,
    data: RecordSource[Any],
    target_side: TargetSide,
    cfg: TrainConfig,
    ctx: DistContext,
) -> StepInputs:
    """The inputs of this process's micro-batches of `groups[index]` (the target's forwards are
    launched, not waited for).

    In an epoch's short last group a process may have fewer micro-batches than rank 0 (which has the
    most), or none. It then runs as many as rank 0, the missing ones on the group's first row with
    weight zero: DDP all-reduces in every process's last backward and FSDP gathers in every forward,
    so all processes must run the same number (evaluation does the same, `evaluate_model`)."""
    group = groups[index]

    def split(rank: int) -> list[list[Row]]:
        return split_for_rank(
            group, rank=rank, world_size=ctx.world_size, batch_size=cfg.batch_size, accum=cfg.grad_accum_steps
        )

    micro = split(ctx.rank)
    real = len(micro)
    micro += [[group[0]]] * (len(split(0)) - real)
    inputs = [target_side.prepare(rows, fetch_rows(data, rows), ctx.device) for rows in micro]
    plans = [batch_step_rows(inp.batch, cfg.ttt_steps) for inp in inputs]
    return StepInputs(epoch, index, micro, inputs, plans, real)


def next_group(plans: Sequence[Sequence[list[Row]]], epoch: int, group: int) -> tuple[int, int] | None:
    """(epoch, group) after `group` of `epoch` in the per-epoch plans (empty epochs skipped), None
    after the last."""
    if group + 1 < len(plans[epoch]):
        return epoch, group + 1
    nxt = epoch + 1
    while nxt < len(plans) and not plans[nxt]:
        nxt += 1
    return (nxt, 0) if nxt < len(plans) else None
