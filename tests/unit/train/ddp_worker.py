"""Worker for test_distributed.py, launched by torchrun: trains the tiny draft with DDP and then FSDP2.

Usage: torchrun --nproc_per_node 2 tests/unit/train/ddp_worker.py OUT_DIR BATCH_SIZE
Writes OUT_DIR/{ddp,fsdp}/draft (rank 0). Everything is rebuilt from seeds in every process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from eaglewire.draft.init import init_draft
from eaglewire.train.distributed import init_distributed, shutdown_distributed
from eaglewire.train.loop import train
from tests.unit.train.conftest import capture_records, make_records
from tests.unit.train.test_distributed import CONFIG, build_target


def main() -> None:
    out, batch_size = Path(sys.argv[1]), int(sys.argv[2])
    ctx = init_distributed("cpu")
    target, contract, side_for = build_target()
    records = capture_records(target, contract, make_records(target.vocab_size, 16, seed=1))
    for parallel in ("ddp", "fsdp"):
        draft = init_draft(target, contract, seed=0)
        cfg = CONFIG.__class__(**{**CONFIG.__dict__, "batch_size": batch_size, "parallel": parallel})
        train(cfg, draft, contract, records, side_for(draft), out_dir=out / parallel, progress=False, ctx=ctx)
    shutdown_distributed()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
