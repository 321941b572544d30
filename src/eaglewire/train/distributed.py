"""Multi-process training under `torchrun`: DDP for drafts that fit per GPU, FSDP2 for large ones.

`torchrun --nproc_per_node N ...` sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; we start
the process group with NCCL on CUDA and gloo on CPU. Gradients are averaged across processes by
both wrappers; the loop scales its loss so that N processes compute the same update as one
process that sees all N micro-batches (see `eaglewire.train.loop`).

NVLink multicast (NVLS) stays off unless the user turned it on: `init_distributed` sets the
variables of `MULTICAST_OFF` that the environment does not set, before NCCL, torch's symmetric
memory or NVSHMEM read them (docs/multi-gpu.md).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from eaglewire.errors import ConfigError

log = logging.getLogger(__name__)

# NCCL, torch's symmetric memory and NVSHMEM each use NVLink multicast (NVLS) where the hardware has
# it. On the shared multi-GPU hosts this project is tested on, a program that uses it can put the
# host's GPUs out of service for a day or more, and no eaglewire run has been measured with it, so
# it stays off unless the user sets these variables.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def disable_nvlink_multicast(env: MutableMapping[str, str]) -> dict[str, str]:
    """Set each MULTICAST_OFF variable `env` lacks (os.environ, or a launcher's environment); returns
    those it set."""
    added = {k: v for k, v in MULTICAST_OFF.items() if k not in env}
    env.update(added)
    return added


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={value!r}: expected an integer (set by torchrun)"
        ) from None


def init_distributed(device: str | None = None) -> DistContext:
    """Start the process group when launched by torchrun (WORLD_SIZE > 1); a single-process context otherwise.

    device: 'cpu', 'cuda' or None (= CUDA when available). Each process uses cuda:LOCAL_RANK.
    """
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", 0)
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but CUDA is not available", fix="pass --device cpu")
    dev = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        added = disable_nvlink_multicast(os.environ)  # NCCL reads them when its communicators start
        if added:
            log.info("NVLink multicast off: %s", " ".join(f"{k}={v}" for k, v in added.items()))
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend=backend)
        log.info("process group: backend=%s rank=%d/%d device=%s", backend, rank, world, dev)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistContext(rank=rank, world_size=world, local_rank=local, device=dev)


def shutdown_distributed(*, wait_for_peers: bool = True) -> None:
    """Leave the process group. `wait_for_peers` (after a run that ended well): first wait until
    every rank got here, so no rank tears its connections down while a peer still talks to it.
    After an error, pass False: the peers may never arrive, and torchrun stops them once this rank
    exits.

    First, the garbage collector frees the wrappers training left behind. A DDP wrapper outlives
    `train()` in reference cycles of its own (counted with the collector off: one per process after
    each run), so the cyclic collector frees it whenever it next runs, possibly after the process
    group is destroyed or at exit. In the 2-process CPU test a gloo rank then sometimes aborted at
    exit ("terminate called without an active exception", after every draft was written): 1 of 150
    runs on an idle 2-core machine. Two loops side by side (each loading the other's 2 cores):
    without this collection 5 aborts in 176 runs, with it 0 in 176."""
    if dist.is_initialized():
        gc.collect()  # while the process group the wrappers hold is still alive
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(x: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum over processes (in place; returns x). A no-op in a single process."""
    if ctx.distributed:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def all_reduce_max(x: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def wrap_model(module: nn.Module, ctx: DistContext, parallel: str) -> nn.Module:
    """DDP or FSDP2 (`fully_shard`) around `module` in a multi-process run; `module` itself otherwise."""
    if not ctx.distributed:
        return module
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(module)
        return module
    raise ConfigError(f"parallel: expected 'ddp' or 'fsdp', got {parallel!r}")


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (FSDP2 shards in place, so it is its own module)."""
    return module.module if hasattr(module, "module") and isinstance(module.module, nn.Module) else module


def set_gradient_sync(module: nn.Module, enabled: bool) -> Any:
    """Context manager skipping the gradient all-reduce for accumulation micro-batches."""
    import contextlib

    no_sync = getattr(module, "no_sync", None)  # DDP
    if callable(no_sync) and not enabled:
        return no_sync()
    set_sync = getattr(module, "set_requires_gradient_sync", None)  # FSDP2
    if callable(set_sync):
        set_sync(enabled)
    return contextlib.nullcontext()
