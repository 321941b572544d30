"""Offline capture: run the target over a tokenized dataset and write hidden-state shards.

Logs a storage estimate before starting and throughput (tokens/s) per shard and overall.
Resumes an interrupted run: shards listed in the manifest or its journal are skipped (after
checking the target still matches the stored contract's fingerprint by values).
"""

from __future__ import annotations

import logging
import os
import shutil
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
from eaglewire.data.batching import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_PACE_BATCHES,
    DEFAULT_SHARD_RECORDS,
    MAX_WINDOW_BATCHES,
    WINDOW_BATCHES,
    capture_windows,
)
from eaglewire.data.capture_batches import ForwardPacer, LaunchedShards, launch_shards
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import MANIFEST_FILE, ShardInfo, ShardWriter, load_manifest
from eaglewire.data.types import ShardContent
from eaglewire.errors import ConfigError, ContractMismatchError
from eaglewire.io_utils import sha256_text
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
    # Where the calling thread's wall time went (they add up to about `seconds`) and what the
    # others did meanwhile: the next run's profile without a profiler.
    launch_seconds: float = 0.0  # queuing windows' forwards and copies (pace_wait included)
    pace_wait_seconds: float = 0.0  # waiting, without the GIL, for the GPU to catch up (ForwardPacer)
    writer_wait_seconds: float = 0.0  # waiting for writers, to bound the shards held in memory
    drain_seconds: float = 0.0  # after the last window was handed over, until every shard was written
    gpu_forward_seconds: float = 0.0  # the compute stream busy with the windows' forwards (CUDA only)
    # the handoff thread waiting for windows' copies to reach the host (not the calling thread's)
    copy_wait_seconds: float = 0.0
    writer_thread_seconds: float = 0.0  # summed over the writer threads, inside ShardWriter.write

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def phases(self) -> str:
        """One log line's worth: the calling thread's phases, the GPU's, the handoff's and the writers' time."""
        return (
            f"launch {self.launch_seconds:.2f}s (pace wait {self.pace_wait_seconds:.2f}s), writer wait "
            f"{self.writer_wait_seconds:.2f}s, drain {self.drain_seconds:.2f}s; GPU forwards "
            f"{self.gpu_forward_seconds:.2f}s; handoff copy wait {self.copy_wait_seconds:.2f}s; writers "
            f"{self.writer_thread_seconds:.2f} thread-s"
        )


def estimate_storage(num_tokens: int, contract: Contract) -> int:
    """Bytes the shards will take: per token (A + 1) * Ht hidden values plus id and mask."""
    elem = torch.empty(0, dtype=getattr(torch, contract.dtype)).element_size()
    per_token = (contract.num_aux + 1) * contract.target.hidden_size * elem + ID_AND_MASK_BYTES
    return num_tokens * per_token


# Room a capture leaves on its disk beyond the shards' estimate (journals, the manifest, other writers).
DISK_MARGIN = 1.02


def check_free_space(output: Path, needed: int, shards: int) -> None:
    """Refuse, before the first forward, a capture whose shards cannot fit on the disk of `output`
    (a full disk would stop it hours in, after every shard it could write)."""
    if shards == 0:
        return
    free = shutil.disk_usage(output).free
    if needed * DISK_MARGIN > free:
        raise ConfigError(
            f"capture into {output}: the {shards} shards still to capture need about {human_bytes(needed)}, "
            f"and {human_bytes(free)} is free on that disk",
            fix="free space there, capture onto a larger disk (another output directory or EAGLEWIRE_HOME), "
            "capture fewer records, or train online (the target inside each step: no shards)",
        )


# Warn when the states a capture may hold in host memory at once exceed this share of its RAM.
HELD_RAM_SHARE = 0.25


def peak_host_bytes(
    window_shard_tokens: Sequence[Sequence[int]], write_workers: int, contract: Contract
) -> int:
    """The most bytes of states a capture holds in host memory at once, from the token counts of the
    shards of each window: `write_workers` of the largest shards waiting for or being written, plus
    the two largest windows (one being copied to the host, the next being captured)."""
    shard_bytes = sorted(
        (estimate_storage(t, contract) for w in window_shard_tokens for t in w), reverse=True
    )
    window_bytes = sorted(
        (sum(estimate_storage(t, contract) for t in w) for w in window_shard_tokens), reverse=True
    )
    return sum(shard_bytes[:write_workers]) + sum(window_bytes[:2])


def physical_memory_bytes() -> int | None:
    """This machine's RAM in bytes, where the OS says (None elsewhere)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def capture_dataset(
    target: LoadedTarget,
    dataset: TokenizedDataset,
    output: Path,
    *,
    aux_boundaries: Sequence[int] | None = None,
    final_norm: NormSide = "pre",
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    shard_records: int = DEFAULT_SHARD_RECORDS,
    source: str = "",
    show_progress: bool = True,
    write_workers: int = 8,
    window_tokens: int | None = None,
    max_window_tokens: int | None = None,
    pace_batches: int = DEFAULT_PACE_BATCHES,
) -> CaptureStats:
    """Capture every record of `dataset` into shards under `output` (see shards.py for the layout).

    Consecutive shards are captured together, a window at a time: half the tokens still to capture,
    at least `window_tokens` and at most `max_window_tokens` (defaults: WINDOW_BATCHES and
    MAX_WINDOW_BATCHES full batches; batching.py says why), the last window at most `write_workers`
    shards (one per writer after the last forward), and a window's shards go to
    the writers as soon as its copies have arrived. The target runs on the calling thread while up
    to `write_workers` threads stream earlier shards to disk and sha256 (held in memory: the shards
    being written, at most write_workers once a window has been handed over, plus the window being
    copied to the host and the one being captured; writing adds no copy of them), so disk and
    sha256 time overlap the target's forwards instead of adding to them. `pace_batches` > 0 keeps
    the launches at most that many batches ahead of the GPU (`ForwardPacer` says why)."""
    if batch_size < 1 or shard_records < 1 or max_batch_tokens < 1 or write_workers < 1:
        raise ConfigError("batch_size, shard_records, max_batch_tokens and write_workers must be >= 1")
    pacer = ForwardPacer(pace_batches)  # checks pace_batches before anything is written
    for name, value in (("window_tokens", window_tokens), ("max_window_tokens", max_window_tokens)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1 (or None for the default), got {value}")
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

    todo: list[tuple[int, int, int]] = []  # shards still to capture: (index, first record, end record)
    for k in range(num_shards):
        lo, hi = k * shard_records, min(len(dataset), (k + 1) * shard_records)
        if writer.done(k):
            stats.shards_resumed += 1
            bar.update(int(lengths[lo:hi].sum()))
        else:
            todo.append((k, lo, hi))
    todo_tokens = [int(lengths[lo:hi].sum()) for _, lo, hi in todo]
    check_free_space(output, estimate_storage(sum(todo_tokens), contract), len(todo))
    groups = capture_windows(
        todo_tokens,
        WINDOW_BATCHES * max_batch_tokens if window_tokens is None else window_tokens,
        MAX_WINDOW_BATCHES * max_batch_tokens if max_window_tokens is None else max_window_tokens,
        last_window_shards=write_workers,
    )
    windows = [[todo[j] for j in group] for group in groups]
    held = peak_host_bytes([[todo_tokens[j] for j in group] for group in groups], write_workers, contract)
    log.info("capture: up to ~%s of states held in host memory at once", human_bytes(held))
    ram = physical_memory_bytes()
    if ram and held > HELD_RAM_SHARE * ram:
        log.warning(
            "capture: up to ~%s of states may be held in host memory at once (shards being written plus "
            "two windows being captured), more than %d%% of this machine's %s: pass a smaller "
            "--shard-records (now %d) or --write-workers (now %d)",
            human_bytes(held),
            round(100 * HELD_RAM_SHARE),
            human_bytes(ram),
            shard_records,
            write_workers,
        )

    on_cuda = target.device.type == "cuda"
    copy_stream = torch.cuda.Stream(target.device) if on_cuda else None
    forward_spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # per window, compute stream
    pending: deque[Future[ShardInfo]] = deque()
    writer_seconds: list[float] = []  # per shard written; list.append is atomic across threads

    def write_shard_timed(k: int, lo: int, content: ShardContent) -> ShardInfo:
        t = time.perf_counter()
        info = writer.write(k, lo, content)
        writer_seconds.append(time.perf_counter() - t)
        return info

    # The calling thread only launches: a handoff thread waits for each window's copies (without
    # the GIL) and queues its shards' writes the moment they have arrived. Handed over by the
    # calling thread instead, after launching the next window, a window's shards waited a window's
    # forwards in memory first, and the last two windows' writes were all left for the end (on an
    # H200 0.26 s waiting for writers and 0.20 s of drain; with the handoff no wait is left,
    # docs/history/benchmarks-log.md §3).
    handed: deque[tuple[list[tuple[int, int, int]], Future[list[Future[ShardInfo]]]]] = deque()
    copy_waits: list[float] = []  # per window, on the handoff thread

    def settle(limit: int, *, keep_newest: bool) -> None:
        """Account written shards, oldest first, until at most `limit` shards are held (being
        written or waiting to be); `keep_newest` leaves the window handed over last uncounted (its
        copies may still be arriving)."""
        newest = 1 if keep_newest else 0

        def held() -> int:
            return len(pending) + sum(len(shards) for shards, _ in list(handed)[: len(handed) - newest])

        while held() > limit:
            if pending:
                account(pending.popleft().result())
            else:
                pending.extend(handed.popleft()[1].result())

    with (
        ThreadPoolExecutor(max_workers=write_workers, thread_name_prefix="shard-writer") as pool,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-handoff") as handoff,
    ):  # shut down in reverse: the handoff first, so it never queues a write into a closed pool

        def hand_over(
            shards: list[tuple[int, int, int]], launched: LaunchedShards
        ) -> list[Future[ShardInfo]]:
            t = time.perf_counter()
            contents = launched.contents()  # the window's shards, packed
            copy_waits.append(time.perf_counter() - t)
            return [
                pool.submit(write_shard_timed, k, lo, content)
                for (k, lo, _), content in zip(shards, contents, strict=True)
            ]

        for shards in windows:
            t = time.perf_counter()
            if on_cuda:
                forward_spans.append(
                    (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                )
                forward_spans[-1][0].record()
            try:
                launched = launch_shards(
                    target,
                    dataset,
                    [range(lo, hi) for _, lo, hi in shards],
                    contract,
                    batch_size=batch_size,
                    max_batch_tokens=max_batch_tokens,
                    copy_stream=copy_stream,
                    pacer=pacer,
                )
            except BaseException:
                # the windows launched before are captured: their shards are still written (each
                # journaled as it completes) so a resumed run skips them
                _finish_quietly(handed, pending)
                raise
            if on_cuda:
                forward_spans[-1][1].record()
            stats.launch_seconds += time.perf_counter() - t
            handed.append((shards, handoff.submit(hand_over, shards, launched)))
            t = time.perf_counter()
            settle(write_workers, keep_newest=True)  # bound the shards held in memory
            stats.writer_wait_seconds += time.perf_counter() - t
        t = time.perf_counter()
        settle(0, keep_newest=False)
        stats.drain_seconds = time.perf_counter() - t
    stats.copy_wait_seconds = sum(copy_waits)
    if forward_spans:  # every copy has arrived; the last end event may still be a step behind
        torch.cuda.current_stream(target.device).synchronize()
        stats.gpu_forward_seconds = sum(a.elapsed_time(b) for a, b in forward_spans) / 1000
    stats.writer_thread_seconds = sum(writer_seconds)
    stats.pace_wait_seconds = pacer.waited_seconds
    bar.close()
    stats.seconds = time.perf_counter() - start
    writer.finish(
        {"capture_stats": {**asdict(stats), "tokens_per_second": round(stats.tokens_per_second, 1)}}
    )
    log.info(
        "capture: wrote %d shards (%d resumed), %d tokens in %.1fs = %.0f tok/s, %s (%s)",
        stats.shards_written,
        stats.shards_resumed,
        stats.tokens,
        stats.seconds,
        stats.tokens_per_second,
        human_bytes(stats.written_bytes),
        stats.phases(),
    )
    return stats


def _finish_quietly(
    handed: deque[tuple[list[tuple[int, int, int]], Future[list[Future[ShardInfo]]]]],
    pending: deque[Future[ShardInfo]],
) -> None:
    """Wait for every shard already handed over to be written, logging (not raising) what failed:
    when a capture stops on an error, that error is the news."""
    for shards, fut in handed:
        err = fut.exception()
        if err is not None:  # a sticky CUDA error while the copies arrived, say
            log.warning(
                "capture: shards %s (captured) could not be written: %s", [k for k, _, _ in shards], err
            )
        else:
            pending.extend(fut.result())
    for write in pending:
        err = write.exception()
        if err is not None:  # a full disk, say
            log.warning("capture: a captured shard could not be written: %s", err)
