"""Each epoch's plan: which rows make up each optimizer step, its fingerprint, and how many steps
the learning-rate schedule counts.

An epoch's plan is `plan_rows` over that epoch's record order, cut into groups of
world_size * grad_accum_steps * batch_size rows (one group per optimizer step). Epochs are planned
when the loop first reaches them, not all before step 1: a time-bounded run with epochs=10_000 (the
clock ends it long before) would otherwise order and pack every record 10,000 times first (0.16 s
an epoch for 25,867 records: 27 minutes, enough for a 900 s training budget to end before its
first step; docs/history/benchmarks-log.md §2x).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import overload

from eaglewire.errors import ConfigError, TrainingError
from eaglewire.train.batches import Row, epoch_order, plan_rows
from eaglewire.train.config import TrainConfig

Groups = list[list[Row]]  # one epoch: a list of optimizer steps, each a list of rows


def plan_groups(
    lengths: Sequence[int],
    config: TrainConfig,
    *,
    epoch: int,
    world_size: int,
    repeats: Sequence[int] | None = None,
) -> Groups:
    """The optimizer-step groups of one epoch (each world_size*grad_accum_steps*batch_size rows, the
    last one possibly fewer); `repeats`: record_repeats' counts. The groups depend on the processes
    only through that product, so every record is trained once an epoch however many processes
    share it, and a run resumes at another world size with the same product (`split_for_rank` deals
    a short last group out; `prepare_step` evens out the micro-batches the processes run)."""
    rows = plan_rows(
        lengths,
        epoch_order(len(lengths), seed=config.seed, epoch=epoch, repeats=repeats),
        max_length=config.max_length,
        pack=config.pack,
    )
    size = world_size * config.grad_accum_steps * config.batch_size
    return [rows[i : i + size] for i in range(0, len(rows), size)]


class EpochPlans(Sequence[Groups]):
    """`plan_groups` of epochs 0 .. config.epochs - 1, each planned on first access. Asking for
    epoch e drops the plans before e - 1 (the loop looks back one epoch at most: a checkpoint at the
    end of an epoch whose successor is already prefetched), so a long run holds a few plans, not all."""

    def __init__(
        self,
        lengths: Sequence[int],
        config: TrainConfig,
        *,
        world_size: int,
        repeats: Sequence[int] | None = None,
    ) -> None:
        if repeats is None and config.source_repeats:
            raise ConfigError(
                f"source_repeats {list(config.source_repeats)}: EpochPlans got no repeat counts (record_repeats)"
            )
        self._lengths, self._config, self._world_size, self._repeats = lengths, config, world_size, repeats
        self._kept: dict[int, Groups] = {}
        self.planned = 0  # plan_groups calls so far (a test checks that unreached epochs cost nothing)

    def __len__(self) -> int:
        return self._config.epochs

    @overload
    def __getitem__(self, epoch: int) -> Groups: ...

    @overload
    def __getitem__(self, epoch: slice) -> list[Groups]: ...

    def __getitem__(self, epoch: int | slice) -> Groups | list[Groups]:
        if isinstance(epoch, slice):
            return [self[e] for e in range(*epoch.indices(len(self)))]
        if not 0 <= epoch < len(self):
            raise IndexError(f"epoch {epoch} of {len(self)}")
        if epoch not in self._kept:
            self._kept = {e: g for e, g in self._kept.items() if e >= epoch - 1}
            self._kept[epoch] = plan_groups(
                self._lengths, self._config, epoch=epoch, world_size=self._world_size, repeats=self._repeats
            )
            self.planned += 1
        return self._kept[epoch]

    def schedule_steps(self) -> tuple[int, bool]:
        """(the optimizer steps the learning-rate schedule spans, whether that is exact).

        Exact when steps or epochs bound the run: min(max_steps, all epochs' steps), planning
        epochs only until max_steps is reached. A time-bounded run (max_seconds, max_steps = 0) is
        usually ended by its clock, so its epochs are not planned ahead: the count is epochs x the
        first epoch's steps, an estimate (packing moves an epoch's row count by a few rows). If the
        epochs do run out first, the schedule ends within those few steps of its floor."""
        cfg = self._config
        if cfg.max_seconds and not cfg.max_steps:
            return len(self[0]) * len(self), False
        total = 0
        for epoch in range(len(self)):
            total += len(self[epoch])
            if cfg.max_steps and total >= cfg.max_steps:
                return cfg.max_steps, True
        return total, True

    def describe_span(self, total: int, exact: bool) -> str:
        """The schedule's span as the log names it. With a wall-time budget the schedule follows
        whichever of the steps and the clock is further along (`train/schedule.py`), so a huge
        estimate (epochs=10_000) does not mean a warmup that never ends."""
        steps = f"{total} steps" if exact else f"an estimated {total} steps"
        seconds = self._config.max_seconds
        return f"{steps} or max_seconds={seconds:g}, whichever is further along" if seconds else steps


def plan_sha256(groups: Sequence[Sequence[Row]]) -> str:
    """sha256 of one epoch's plan: which records (and how many of their tokens) each row of each
    step holds. A checkpoint keeps it for its epoch, so a resume whose plan differs (other data or
    lengths, another packing rule) is refused instead of continuing at a position that now points
    at other records."""
    digest = hashlib.sha256()
    for group in groups:
        for row in group:
            digest.update(b"r" + b",".join(b"%d:%d" % (s.record, s.length) for s in row))
        digest.update(b"|")
    return digest.hexdigest()


def epoch_plan_sha256(plans: Sequence[Groups], epoch: int) -> str | None:
    """plan_sha256 of `plans[epoch]`; None past the last epoch (a checkpoint taken after training)."""
    return plan_sha256(plans[epoch]) if epoch < len(plans) else None


def check_resumed_plan(
    saved: str | None, plans: Sequence[Groups], epoch: int, group: int, where: Path
) -> None:
    """Refuse resuming checkpoint `where` at (epoch, group) when that epoch's plan is not the one it
    saved (`saved`: its epoch_plan_sha256; None in checkpoints from versions that kept none)."""
    now = epoch_plan_sha256(plans, epoch)
    if saved is not None and now is not None and now != saved:
        raise TrainingError(
            f"{where}: epoch {epoch}'s plan of rows (sha256 {saved[:12]}) differs from this launch's "
            f"({now[:12]}): the records, their lengths or the packing rule changed, so the saved position "
            f"(epoch {epoch}, step {group} of it) would point at other records",
            fix="resume with the data and eaglewire version the run started with, or start a new run (another --out)",
        )
