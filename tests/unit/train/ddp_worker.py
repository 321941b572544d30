"""Worker for test_distributed.py, launched by torchrun (2 processes, gloo): the runs of dist_setup.py.

Usage: torchrun --nproc_per_node 2 tests/unit/train/ddp_worker.py OUT_DIR
Expects OUT_DIR/w1_to_w2: a 1-process run stopped after step STOP. Rank 0 writes the runs' drafts and
checkpoints under OUT_DIR; each rank writes OUT_DIR/rank-R.json: the record ids of each step it ran
(`Runs.steps`) and the NVLink multicast variables it saw after init_distributed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from eaglewire.train.distributed import MULTICAST_OFF, barrier, init_distributed, shutdown_distributed
from tests.unit.train.dist_setup import STOP, Runs


def main() -> None:
    out = Path(sys.argv[1])
    ctx = init_distributed("cpu")
    env = {k: os.environ.get(k) for k in MULTICAST_OFF}
    runs = Runs(out, ctx)
    runs.train("ddp")
    runs.train("fsdp", parallel="fsdp")
    runs.train("ddp_stop", stop=STOP)
    if ctx.is_main:
        runs.copy_run("ddp_stop", "w2_to_w1")  # the test resumes it in 1 process
    barrier(ctx)
    runs.train("ddp_stop", resume=True, record_as="ddp_stop+resume")
    runs.train("fsdp_stop", parallel="fsdp", stop=STOP)
    runs.train("fsdp_stop", parallel="fsdp", resume=True, record_as="fsdp_stop+resume")
    runs.train("w1_to_w2", resume=True, record_as="w1_to_w2+resume")
    (out / f"rank-{ctx.rank}.json").write_text(json.dumps({"steps": runs.steps, "env": env}))
    shutdown_distributed()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
