"""Offline capture: run the target over a tokenized dataset and write hidden-state shards.

Logs a storage estimate before starting and throughput (tokens/s) per shard and overall.
Resumes an interrupted run: shards listed in the manifest are skipped (after checking the
target still matches the stored contract's fingerprint by values).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from eaglewire.contract.contract import Contract
from eaglewire.contract.fingerprint import NormSide
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import MANIFEST_FILE, ShardInfo, ShardWriter, load_manifest
from eaglewire.data.types import CapturedRecord
from eaglewire.errors import ConfigError, ContractMismatchError
from eaglewire.io_utils import sha256_text
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract, check_fingerprint, tokenizer_hash
from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

# Per stored token besides the hidden states: int64 id + bool mask.
ID_AND_MASK_BYTES = 9


@dataclass
class CaptureStats:
    records: int = 0
    tokens: int = 0
    shards_written: int = 0
    shards_resumed: int = 0
    estimated_bytes: int = 0
    written_bytes: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def estimate_storage(num_tokens: int, contract: Contract) -> int:
    """Bytes the shards will take: per token (A + 1) * Ht hidden values plus id and mask."""
    elem = torch.empty(0, dtype=getattr(torch, contract.dtype)).element_size()
    per_token = (contract.num_aux + 1) * contract.target.hidden_size * elem + ID_AND_MASK_BYTES
    return num_tokens * per_token


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _batches(lengths: Sequence[int], batch_size: int, max_batch_tokens: int) -> list[list[int]]:
    """Indices grouped longest-first so padding stays small; each batch <= max_batch_tokens padded."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) >= batch_size or width * (len(cur) + 1) > max_batch_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


@dataclass
class HostCopy:
    """A batch's states on their way to pinned host memory: aux [B, T, A*Ht], final [B, T, Ht];
    `arrived` marks the end of the copy (None: already on the host)."""

    aux: torch.Tensor
    final: torch.Tensor
    arrived: torch.cuda.Event | None

    def wait(self) -> None:
        if self.arrived is not None:
            self.arrived.synchronize()


def _to_host(aux: torch.Tensor, final: torch.Tensor, copy_stream: torch.cuda.Stream | None) -> HostCopy:
    """Start copying aux [B, T, A*Ht] and final [B, T, Ht] into pinned host memory on `copy_stream`.

    On the compute stream the copy (~75 MB a batch for SmolLM2) would sit between two forwards on
    the GPU's timeline; on its own stream a copy engine moves it while the next batch's forward
    runs. record_stream keeps the caching allocator from handing the device tensors' memory to that
    forward before the copy has read it."""
    if aux.device.type != "cuda" or copy_stream is None:
        return HostCopy(aux, final, None)
    aux_host = torch.empty(aux.shape, dtype=aux.dtype, pin_memory=True)
    final_host = torch.empty(final.shape, dtype=final.dtype, pin_memory=True)
    copy_stream.wait_stream(torch.cuda.current_stream(aux.device))  # the states are written
    with torch.cuda.stream(copy_stream):
        aux_host.copy_(aux, non_blocking=True)
        final_host.copy_(final, non_blocking=True)
        arrived = torch.cuda.Event()
        arrived.record(copy_stream)
    aux.record_stream(copy_stream)
    final.record_stream(copy_stream)
    return HostCopy(aux_host, final_host, arrived)


def capture_records(
    target: LoadedTarget,
    dataset: TokenizedDataset,
    indices: Sequence[int],
    contract: Contract,
    *,
    batch_size: int,
    max_batch_tokens: int,
) -> list[CapturedRecord]:
    """Capture the contract's states for `indices` of `dataset`, returned in the order of `indices`.

    On CUDA every batch's states are copied into pinned host memory on a copy stream, without
    waiting (the copy of batch i overlaps the forward of batch i+1; a pageable `.cpu()` would stall
    the GPU once per batch); the records are cut out once all batches are queued."""
    recs = [dataset[i] for i in indices]
    lengths = [int(r.input_ids.numel()) for r in recs]
    device = target.device
    on_cuda = device.type == "cuda"
    copy_stream = torch.cuda.Stream(device) if on_cuda else None
    queued: list[tuple[list[int], HostCopy]] = []
    for group in _batches(lengths, batch_size, max_batch_tokens):
        width = max(lengths[i] for i in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)  # [B, T] right-padded
        attn = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            ids[row, : lengths[i]] = recs[i].input_ids
            attn[row, : lengths[i]] = 1
        if on_cuda:
            ids, attn = ids.pin_memory(), attn.pin_memory()
        states = capture(
            target.model,
            ids.to(device, non_blocking=True),
            aux_boundaries=contract.aux_boundaries,
            final=contract.final,
            attention_mask=attn.to(device, non_blocking=True),
        )
        queued.append((group, _to_host(states.aux, states.final, copy_stream)))
    out: list[CapturedRecord | None] = [None] * len(recs)
    for group, host in queued:
        host.wait()  # the host buffers hold this batch now
        aux, final = host.aux, host.final
        for row, i in enumerate(group):
            T = lengths[i]
            out[i] = CapturedRecord(
                recs[i].record_id,
                recs[i].input_ids,
                recs[i].loss_mask,
                aux[row, :T],  # views: the shard writer streams them to the file without a copy
                final[row, :T],
            )
    return [r for r in out if r is not None]


def capture_dataset(
    target: LoadedTarget,
    dataset: TokenizedDataset,
    output: Path,
    *,
    aux_boundaries: Sequence[int] | None = None,
    final_norm: NormSide = "pre",
    batch_size: int = 8,
    max_batch_tokens: int = 16384,
    shard_records: int = 256,
    source: str = "",
    show_progress: bool = True,
    write_workers: int = 8,
) -> CaptureStats:
    """Capture every record of `dataset` into shards under `output` (see shards.py for the layout).

    The target runs on the calling thread while up to `write_workers` threads stream earlier shards
    to disk and sha256 (at most write_workers + 1 shards' records are held in memory; writing adds
    no copy of them), so disk and sha256 time overlap the target's forwards instead of adding to
    them."""
    if batch_size < 1 or shard_records < 1 or max_batch_tokens < 1 or write_workers < 1:
        raise ConfigError("batch_size, shard_records, max_batch_tokens and write_workers must be >= 1")
    want = dataset.meta.get("tokenizer_hash")
    if want and target.tokenizer is not None and tokenizer_hash(target.tokenizer) != want:
        raise ContractMismatchError(
            f"dataset {source or ''} was tokenized with another tokenizer than target {target.path} "
            f"(tokenizer_hash {want[:12]} vs {tokenizer_hash(target.tokenizer)[:12]})",
            fix="rebuild the dataset with `eaglewire data build --target <this target>`",
        )
    output = Path(output)
    contract = build_contract(target, aux_boundaries, final_norm=final_norm)
    if (output / MANIFEST_FILE).exists():
        old = Contract.from_json(load_manifest(output)["contract"])
        if old.fingerprint is not None:
            check_fingerprint(old, target)  # same weights, by values, before appending to old shards
    plan = {
        "dataset": source,
        "record_ids_sha256": sha256_text("\n".join(dataset.record_ids)),
        "shard_records": shard_records,
        "records": len(dataset),
    }
    writer = ShardWriter(output, contract, plan=plan, total_records=len(dataset))
    stats = CaptureStats(estimated_bytes=estimate_storage(dataset.num_tokens, contract))
    log.info(
        "capture: %d records, %d tokens, aux boundaries %s + final boundary %d (%s-norm), %s: about %s of shards",
        len(dataset),
        dataset.num_tokens,
        list(contract.aux_boundaries),
        contract.final.boundary,
        contract.final.norm,
        contract.dtype,
        human_bytes(stats.estimated_bytes),
    )
    num_shards = (len(dataset) + shard_records - 1) // shard_records
    lengths = dataset.lengths()
    bar = tqdm(
        total=dataset.num_tokens, desc="capture", unit="tok", unit_scale=True, disable=not show_progress
    )
    start = time.perf_counter()

    def account(info: ShardInfo) -> None:
        stats.shards_written += 1
        stats.records += info.records
        stats.tokens += info.tokens
        stats.written_bytes += info.bytes
        bar.update(info.tokens)
        bar.set_postfix_str(f"{stats.tokens / (time.perf_counter() - start):.0f} tok/s")
        log.debug("shard %d: %d records, %d tokens written", info.index, info.records, info.tokens)

    pending: deque[Future[ShardInfo]] = deque()
    with ThreadPoolExecutor(max_workers=write_workers, thread_name_prefix="shard-writer") as pool:
        for k in range(num_shards):
            lo, hi = k * shard_records, min(len(dataset), (k + 1) * shard_records)
            if writer.done(k):
                stats.shards_resumed += 1
                bar.update(int(lengths[lo:hi].sum()))
                continue
            recs = capture_records(
                target,
                dataset,
                range(lo, hi),
                contract,
                batch_size=batch_size,
                max_batch_tokens=max_batch_tokens,
            )
            pending.append(pool.submit(writer.write, k, lo, recs))
            while len(pending) > write_workers:  # bound the shards held in memory
                account(pending.popleft().result())
        while pending:
            account(pending.popleft().result())
    bar.close()
    stats.seconds = time.perf_counter() - start
    writer.finish(
        {"capture_stats": {**asdict(stats), "tokens_per_second": round(stats.tokens_per_second, 1)}}
    )
    log.info(
        "capture: wrote %d shards (%d resumed), %d tokens in %.1fs = %.0f tok/s, %s",
        stats.shards_written,
        stats.shards_resumed,
        stats.tokens,
        stats.seconds,
        stats.tokens_per_second,
        human_bytes(stats.written_bytes),
    )
    return stats
