"""The target's forwards over batches of records, and their states copied into packed host buffers.

`launch_shards` runs the target over groups of records (one shard's records each), longest first
and right-padded, and copies every record's rows straight into its group's pinned host buffers on
a copy stream; `ForwardPacer` keeps those launches at most a few batches ahead of the GPU.
`capture.capture_dataset` drives them a window at a time and hands the groups to the shard writers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from eaglewire.contract.contract import Contract
from eaglewire.data.batching import length_batches
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.types import CapturedRecord, ShardContent, TokenizedRecord
from eaglewire.errors import ConfigError
from eaglewire.target.capture import capture
from eaglewire.target.loading import LoadedTarget


class ForwardPacer:
    """Keeps the host at most `depth` batches ahead of the GPU: before a batch's forward is launched,
    waits until the forward launched `depth` batches earlier has finished (depth 0: never waits).

    Why: a torch kernel launch holds the GIL, and once CUDA's launch queue is full (on the order of
    a thousand kernels, about one forward of a 30-layer target) the launch blocks inside the driver
    still holding it, while the shard-writer threads need the GIL between the buffers they hash and
    write. `torch.cuda.Event.synchronize` waits without the GIL. Measured on an H200
    (docs/history/benchmarks-log.md §3): 1M tokens end to end at 0.56-0.57 of the prefill paced, 0.52 not."""

    def __init__(self, depth: int) -> None:
        if depth < 0:
            raise ConfigError(f"pace_batches: expected >= 0 (0 = never wait for the GPU), got {depth}")
        self.depth = depth
        self.unfinished: deque[torch.cuda.Event] = deque()  # forwards launched, oldest first
        self.waited_seconds = 0.0

    def before_launch(self) -> None:
        if self.depth and len(self.unfinished) >= self.depth:
            t = time.perf_counter()
            while len(self.unfinished) >= self.depth:
                self.unfinished.popleft().synchronize()  # releases the GIL
            self.waited_seconds += time.perf_counter() - t

    def after_launch(self, device: torch.device) -> None:
        if self.depth and device.type == "cuda":
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(device))
            self.unfinished.append(done)


@dataclass
class LaunchedShards:
    """Groups of records whose states are on their way into host buffers packed per group (one
    `ShardContent` each, in the order the groups were given); `contents()` waits for the copies."""

    packed: list[ShardContent]
    arrived: torch.cuda.Event | None  # the last copy's end on the copy stream (None: on the host already)

    def contents(self) -> list[ShardContent]:
        if self.arrived is not None:
            self.arrived.synchronize()  # releases the GIL
        return self.packed


def launch_shards(
    target: LoadedTarget,
    dataset: TokenizedDataset,
    groups: Sequence[Sequence[int]],
    contract: Contract,
    *,
    batch_size: int,
    max_batch_tokens: int,
    copy_stream: torch.cuda.Stream | None = None,
    pacer: ForwardPacer | None = None,
) -> LaunchedShards:
    """Run the target over the records of `groups` (each a list of indices of `dataset`: one shard's
    records, in order) and start copying the contract's states into one host buffer per group and
    tensor, without waiting for the copies (on CUDA the forwards are queued too): `.contents()` waits.

    All groups' records are batched together, longest first (`length_batches`). Batches are
    right-padded and get no padding mask: under causal attention a real token never attends to the
    padding after it, so its states are the same as unpadded, and without a mask SDPA may pick flash
    attention (no per-shape plans, unlike cuDNN; faster than the masked kernels).

    Each record's rows go straight to their place in its group's buffers (pinned on CUDA), copied on
    `copy_stream` (one is made if None) so a copy engine moves batch i while batch i + 1's forward
    runs; a group's buffers are then exactly the shard's `aux` and `final` tensors, and a writer
    thread hashes and writes each with one call (safetensors_stream.py says why that matters).
    `pacer` bounds how far the launches run ahead of the GPU (across calls: it keeps its events)."""
    device = target.device
    on_cuda = device.type == "cuda"
    if on_cuda and copy_stream is None:
        copy_stream = torch.cuda.Stream(device)
    dtype = getattr(torch, contract.dtype)
    Ht = contract.target.hidden_size
    recs: list[TokenizedRecord] = []
    lengths: list[int] = []  # per record of `recs`
    where: list[tuple[int, int]] = []  # per record of `recs`: (its group, its first row in the group)
    packed: list[ShardContent] = []
    for g, indices in enumerate(groups):
        group = [dataset[i] for i in indices]
        group_lengths = [int(r.input_ids.numel()) for r in group]
        rows = 0
        for T in group_lengths:
            where.append((g, rows))
            rows += T
        recs.extend(group)
        lengths.extend(group_lengths)
        packed.append(
            ShardContent(
                record_ids=[r.record_id for r in group],
                lengths=group_lengths,
                input_ids=[torch.cat([r.input_ids.to(torch.int64) for r in group])],  # [N]
                loss_mask=[torch.cat([r.loss_mask.bool() for r in group])],  # [N]
                aux=[torch.empty((rows, contract.num_aux * Ht), dtype=dtype, pin_memory=on_cuda)],
                final=[torch.empty((rows, Ht), dtype=dtype, pin_memory=on_cuda)],
            )
        )
    for batch in length_batches(lengths, batch_size, max_batch_tokens):
        width = max(lengths[i] for i in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)  # [B, T] right-padded
        for row, i in enumerate(batch):
            ids[row, : lengths[i]] = recs[i].input_ids
        if on_cuda:
            ids = ids.pin_memory()
        if pacer is not None:
            pacer.before_launch()
        try:
            states = capture(
                target.model,
                ids.to(device, non_blocking=True),
                aux_boundaries=contract.aux_boundaries,
                final=contract.final,
            )  # aux [B, T, A*Ht], final [B, T, Ht]
        except torch.OutOfMemoryError as e:
            raise ConfigError(
                f"capture: a batch of {len(batch)} records x {width} tokens ({len(batch) * width} padded "
                f"tokens, max_batch_tokens {max_batch_tokens}, batch_size {batch_size}) ran out of memory on {device}",
                fix="rerun the same command with a smaller --max-batch-tokens (shards already written are kept and skipped)",
            ) from e
        if pacer is not None:
            pacer.after_launch(device)
        if copy_stream is not None:
            copy_stream.wait_stream(torch.cuda.current_stream(device))  # the states are written
        with torch.cuda.stream(copy_stream) if copy_stream is not None else nullcontext():
            for row, i in enumerate(batch):
                (g, lo), T = where[i], lengths[i]
                packed[g].aux[0][lo : lo + T].copy_(states.aux[row, :T], non_blocking=on_cuda)
                packed[g].final[0][lo : lo + T].copy_(states.final[row, :T], non_blocking=on_cuda)
        if copy_stream is not None:
            # keeps the caching allocator from handing the states' memory to the next forward
            # before the copies have read it
            states.aux.record_stream(copy_stream)
            states.final.record_stream(copy_stream)
    arrived = None
    if copy_stream is not None:
        arrived = torch.cuda.Event()
        arrived.record(copy_stream)
    return LaunchedShards(packed, arrived)


def capture_records(
    target: LoadedTarget,
    dataset: TokenizedDataset,
    indices: Sequence[int],
    contract: Contract,
    *,
    batch_size: int,
    max_batch_tokens: int,
) -> list[CapturedRecord]:
    """Capture the contract's states for `indices` of `dataset`, returned in the order of `indices`
    (`launch_shards` with one group, waited for; each record a view into the group's buffers)."""
    launched = launch_shards(
        target, dataset, [indices], contract, batch_size=batch_size, max_batch_tokens=max_batch_tokens
    )
    return launched.contents()[0].records()
