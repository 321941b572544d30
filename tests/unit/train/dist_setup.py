"""What test_distributed.py and its torchrun worker (ddp_worker.py) share: the run's settings, the
tiny target, the records, and a recorder of which records each process trained on."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from eaglewire.draft.init import init_draft
from eaglewire.target.identity import build_contract
from eaglewire.train.config import TrainConfig
from eaglewire.train.loop import TrainResult, records_log, train
from eaglewire.train.target_side import OfflineTarget, TargetHead
from tests.helpers.tiny import make_peaked_target
from tests.unit.train.conftest import capture_records, make_records

# 9 unpacked records = 9 rows an epoch = optimizer steps of 4, 4 and 1 rows (2 processes x 2 rows, or
# 1 process x 4): in each epoch's last step the second process has no row. 2 epochs = 6 steps.
NUM_RECORDS = 9
STEPS = 6
STOP = 4  # the interrupted runs stop after step 4: epoch 1, its second step
CONFIG = TrainConfig(
    ttt_steps=3,
    max_length=48,
    pack=False,
    batch_size=2,  # per process; the 1-process runs use 4
    learning_rate=3e-3,
    warmup_ratio=0.25,
    epochs=2,
    grad_accum_steps=1,
    seed=0,
    checkpoint_every=STOP,  # every run keeps its step-4 checkpoint (keep_checkpoints=2: steps 4 and 6)
)

# Where each launch's steps are recorded: {run name: [[rank, epoch, group, [record ids]], ...]}.
Steps = list[tuple[int, int, int, list[str]]]


def build_target() -> tuple[Any, Any, Any]:
    target = make_peaked_target()
    contract = build_contract(target, fingerprint=False)

    def side_for(draft):
        return OfflineTarget(TargetHead.from_target(target, contract.final), contract, draft.draft_to_target)

    return target, contract, side_for


class Runs:
    """Trains the tiny draft in this process (1 process, or one of torchrun's), recording each run's
    steps by record id."""

    def __init__(self, out: Path, ctx: Any = None) -> None:
        self.out, self.ctx = out, ctx
        self.target, self.contract, self.side_for = build_target()
        vocab = self.target.vocab_size
        self.records = capture_records(self.target, self.contract, make_records(vocab, NUM_RECORDS, seed=1))
        self.steps: dict[str, Steps] = {}

    def train(
        self,
        run: str,
        *,
        resume: bool = False,
        stop: int | None = None,
        record_as: str | None = None,
        **changes: Any,
    ) -> TrainResult:
        """Train (or `resume`) the run in out/`run` with CONFIG's settings but `changes`, recording its
        steps as `record_as` (default: `run`)."""
        draft = init_draft(self.target, self.contract, seed=0)
        with recording(self.steps.setdefault(record_as or run, [])):
            return train(replace(CONFIG, **changes), draft, self.contract, self.records, self.side_for(draft),
                         out_dir=self.out / run, resume=resume, stop_after_steps=stop, progress=False,
                         ctx=self.ctx)  # fmt: skip

    def copy_run(self, name: str, to: str) -> None:
        shutil.copytree(self.out / name, self.out / to)

    def save_steps(self, path: Path) -> None:
        path.write_text(json.dumps(self.steps))


@contextmanager
def recording(into: Steps) -> Iterator[None]:
    """Collect the loop's per-step record lines (`records_log`, DEBUG) into `into`."""

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            rank, epoch, group, ids = record.args  # type: ignore[misc]
            into.append((rank, epoch, group, list(ids)))

    handler, level = Collect(logging.DEBUG), records_log.level
    records_log.addHandler(handler)
    records_log.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        records_log.removeHandler(handler)
        records_log.setLevel(level)
