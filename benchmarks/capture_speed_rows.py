"""The rows `capture_speed.py` times (its docstring says what each measures): the in-memory passes
from the prefill to the pipelined capture, the shard writer and its halves on one capture held in host
memory, and `capture_dataset` end to end, one row per settings variant. The script keeps the options,
the data, the timing loop and the report."""

from __future__ import annotations

import argparse
import hashlib
import inspect
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from eaglewire.contract.contract import Contract
from eaglewire.data.batching import MAX_WINDOW_BATCHES, WINDOW_BATCHES, capture_windows
from eaglewire.data.capture import capture_dataset
from eaglewire.data.capture_batches import launch_shards
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.safetensors_stream import _byte_view
from eaglewire.data.shards import shard_file_name, write_shard
from eaglewire.data.types import ShardContent
from eaglewire.nn.attention import varying_shape_attention
from eaglewire.target.capture import capture
from eaglewire.target.loading import LoadedTarget

log = logging.getLogger("capture_speed")

# The defaults `eaglewire data capture` and `capture_dataset` use (one place: the library's signature).
CAPTURE_DEFAULTS = {
    k: v.default
    for k, v in inspect.signature(capture_dataset).parameters.items()
    if k in ("batch_size", "max_batch_tokens", "shard_records", "write_workers", "pace_batches")
}

Batch = tuple[torch.Tensor, torch.Tensor, int]  # ids [B, T], attention mask [B, T], real tokens
TimedRow = tuple[str, Callable[[], None], str]  # name, one pass over the records, what it measures


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def profile_pass(fn: Callable[[], Any], device: torch.device, top: int = 20) -> dict[str, Any]:
    """One profiled pass of `fn`: its wall seconds and the top operations by host (self CPU) time
    and, on CUDA, by device time, as torch.profiler tables (text)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    out: dict[str, Any] = {
        "wall_s": wall,
        "by_host_time": events.table(sort_by="self_cpu_time_total", row_limit=top),
    }
    if device.type == "cuda":
        out["by_device_time"] = events.table(sort_by="self_device_time_total", row_limit=top)
    return out


@dataclass(frozen=True)
class ShardLayout:
    """capture_dataset's shards (record ranges of --shard-records) and its windows: consecutive
    shards captured together (data/batching.py: capture_windows)."""

    shards: list[range]
    windows: list[list[range]]


def shard_layout(ds: TokenizedDataset, args: argparse.Namespace) -> ShardLayout:
    shards = [
        range(lo, min(len(ds), lo + args.shard_records)) for lo in range(0, len(ds), args.shard_records)
    ]
    lengths = ds.lengths()
    windows = [
        [shards[k] for k in window]
        for window in capture_windows(
            [int(lengths[r.start : r.stop].sum()) for r in shards],
            WINDOW_BATCHES * args.max_batch_tokens,
            MAX_WINDOW_BATCHES * args.max_batch_tokens,
            last_window_shards=args.write_workers,
        )
    ]
    return ShardLayout(shards, windows)


def memory_rows(
    target: LoadedTarget,
    ds: TokenizedDataset,
    batches: list[Batch],
    contract: Contract,
    layout: ShardLayout,
    args: argparse.Namespace,
) -> list[TimedRow]:
    """The in-memory rows in the order they run, each a pass over `batches` (or the layout's shards)."""
    model: Any = target.model
    device = target.device
    sizes = dict(batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens)

    def prefill() -> None:
        for ids, attn, _ in batches:
            model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=1)

    def prefill_no_cudnn() -> None:
        with varying_shape_attention():
            prefill()

    def prefill_unmasked() -> None:
        for ids, _, _ in batches:
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    def capture_masked() -> None:
        for ids, attn, _ in batches:
            capture(
                model, ids, aux_boundaries=contract.aux_boundaries, final=contract.final, attention_mask=attn
            )

    def capture_states() -> None:
        for ids, _, _ in batches:
            capture(model, ids, aux_boundaries=contract.aux_boundaries, final=contract.final)

    # capture_copies: one pinned buffer pair for the largest batch, reused (the copy stream runs
    # the copies in order, so a batch's copy never overlaps the previous one into the same bytes)
    copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    most = max(int(ids.numel()) for ids, _, _ in batches)
    widths = (len(contract.aux_boundaries) * target.hidden_size, target.hidden_size)
    model_dtype = next(model.parameters()).dtype
    reused = [torch.empty(most * w, dtype=model_dtype, pin_memory=device.type == "cuda") for w in widths]

    def copies() -> None:
        for ids, _, _ in batches:
            states = capture(model, ids, aux_boundaries=contract.aux_boundaries, final=contract.final)
            if copy_stream is None:  # on the CPU: no copy
                continue
            copy_stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(copy_stream):
                for t, buf in zip((states.aux, states.final), reused, strict=True):
                    buf[: t.numel()].view(t.shape).copy_(t, non_blocking=True)
                    t.record_stream(copy_stream)
        if copy_stream is not None:
            copy_stream.synchronize()

    def records_by_shard() -> None:
        for indices in layout.shards:
            launch_shards(target, ds, [indices], contract, **sizes).contents()

    def records_by_window() -> None:
        for groups in layout.windows:
            launch_shards(target, ds, groups, contract, **sizes).contents()

    def records_pipelined() -> None:
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        previous = None
        for groups in layout.windows:
            launched = launch_shards(target, ds, groups, contract, copy_stream=stream, **sizes)
            if previous is not None:
                previous.contents()
            previous = launched
        if previous is not None:
            previous.contents()

    return [
        ("prefill", prefill, "forward, logits of the last position only, padding mask, cuDNN allowed"),
        ("prefill_no_cudnn", prefill_no_cudnn, "the same without cuDNN attention"),
        ("prefill_unmasked", prefill_unmasked, "the same batches without the padding mask (causal only)"),
        (
            "capture_masked",
            capture_masked,
            "forward + contract hooks with the padding mask (the old library)",
        ),
        ("capture_states", capture_states, "forward + contract hooks, no padding mask (the library now)"),
        ("capture_copies", copies, "+ copy to one reused pinned buffer pair (the copy alone)"),
        (
            "capture_records_by_shard",
            records_by_shard,
            "+ copy each record into its shard's host buffers, each shard batched alone",
        ),
        (
            "capture_records",
            records_by_window,
            "+ copy each record into its shard's host buffers, a window of shards at a time (not written)",
        ),
        (
            "capture_pipelined",
            records_pipelined,
            "+ copy to host, next window launched before waiting (capture_dataset's order, not written)",
        ),
    ]


def _raw_write(path: Path, content: ShardContent) -> int:
    """The shard's aux and final bytes into one file, no header and no sha256 (the disk alone)."""
    n = 0
    with open(path, "wb") as f:
        for t in (*content.aux, *content.final):
            n += f.write(_byte_view(t))
    return n


def _hash_only(content: ShardContent) -> int:
    """sha256 over the shard's aux and final bytes in memory (the hash alone)."""
    digest, n = hashlib.sha256(), 0
    for t in (*content.aux, *content.final):
        view = _byte_view(t)
        digest.update(view)
        n += len(view)
    return n


def writer_rows(
    ds: TokenizedDataset,
    shards: list[range],
    captured: list[ShardContent],
    work_root: Path,
    args: argparse.Namespace,
    suffix: str = "",
) -> list[dict[str, Any]]:
    """The shard writer alone and its two halves, on one capture's shards held in host memory
    (`captured`: each shard's content, packed as capture packs it), each by --write-workers threads, a shard per task:
    write_shards (`write_shard`: safetensors streamed with sha256, into a fresh directory per
    repeat), write_raw (the same bytes to files, no hash), sha256_only (the hash, no file). MB/s
    shows whether the disk or the hash bounds the writer."""

    tasks: list[tuple[str, Callable[[Path, int], int], str]] = [
        ("write_shards", lambda out, k: write_shard(out / shard_file_name(k), k, shards[k].start, captured[k]).bytes, "the shard writer alone"),
        ("write_raw", lambda out, k: _raw_write(out / f"raw_{k}.bin", captured[k]), "the states' bytes to files, no sha256"),
        ("sha256_only", lambda out, k: _hash_only(captured[k]), "sha256 of the states' bytes, no file"),
    ]  # fmt: skip
    rows = []
    for name, task, what in tasks:
        seconds, nbytes = [], 0
        for _ in range(args.repeats):
            out = Path(tempfile.mkdtemp(prefix=f"{name}_", dir=work_root))
            try:
                t0 = time.perf_counter()
                with ThreadPoolExecutor(max_workers=args.write_workers) as pool:
                    nbytes = sum(pool.map(lambda k, out=out, task=task: task(out, k), range(len(shards))))
                seconds.append(time.perf_counter() - t0)
            finally:
                shutil.rmtree(out, ignore_errors=True)
        r = result_row(
            name + suffix, ds.num_tokens, seconds, f"{what} under {work_root}, {args.write_workers} threads"
        )
        r["write_mb_per_s"] = nbytes / r["seconds"] / 1e6 if r["seconds"] > 0 else 0.0
        log.info("%s: %.0f MB/s (passes %s s)", name, r["write_mb_per_s"], [round(x, 3) for x in seconds])
        rows.append(r)
    return rows


def result_row(name: str, tokens: int, seconds: list[float], what: str) -> dict[str, Any]:
    s = statistics.median(seconds)
    return {
        "name": name,
        "what": what,
        "tokens": tokens,
        "seconds": s,
        "seconds_all": seconds,
        "tokens_per_s": tokens / s if s > 0 else 0.0,
    }


@dataclass(frozen=True)
class DatasetVariant:
    """One capture_dataset row: where its shards go and the settings it changes."""

    name: str
    work_root: Path
    what: str
    shard_records: int
    pace_batches: int = CAPTURE_DEFAULTS["pace_batches"]
    switch_interval: float = 0.0  # > 0: sys.setswitchinterval for this row's runs only
    max_window_batches: int | None = None  # None: the library's ceiling (MAX_WINDOW_BATCHES)


def dataset_variants(args: argparse.Namespace, work_root: Path) -> list[DatasetVariant]:
    """The capture_dataset rows: the library's defaults first, then one row per value of
    --dataset-shard-records, --dataset-max-window-batches, --second-work, --pace-batches, --switch-interval."""
    what = "eaglewire data capture's library call: + shards written under {}, {} records a shard, {}"

    def paced(depth: int) -> str:
        return f"the host at most {depth} batches ahead of the GPU" if depth else "launches unbounded"

    default_pace = CAPTURE_DEFAULTS["pace_batches"]
    variants = [
        DatasetVariant(
            "capture_dataset",
            work_root,
            what.format(work_root, args.shard_records, paced(default_pace)),
            args.shard_records,
        )
    ]
    for n in [int(x) for x in args.dataset_shard_records.split(",") if x.strip()]:
        variants.append(
            DatasetVariant(
                f"capture_dataset_shards{n}", work_root, what.format(work_root, n, paced(default_pace)), n
            )
        )
    for n in [int(x) for x in args.dataset_max_window_batches.split(",") if x.strip()]:
        variants.append(
            DatasetVariant(
                f"capture_dataset_maxwindow{n}",
                work_root,
                what.format(work_root, args.shard_records, paced(default_pace))
                + f", windows of at most {n} full batches",
                args.shard_records,
                max_window_batches=n,
            )
        )
    if args.second_work is not None:  # the same into another file system (RAM-backed: not the disk)
        variants.append(
            DatasetVariant(
                "capture_dataset_second",
                args.second_work,
                what.format(args.second_work, args.shard_records, paced(default_pace)),
                args.shard_records,
            )
        )
    for depth in [int(x) for x in args.pace_batches.split(",") if x.strip()]:
        variants.append(
            DatasetVariant(
                f"capture_dataset_pace{depth}",
                work_root,
                what.format(work_root, args.shard_records, paced(depth)),
                args.shard_records,
                pace_batches=depth,
            )
        )
    if args.switch_interval > 0:
        variants.append(
            DatasetVariant(
                "capture_dataset_switch",
                work_root,
                what.format(work_root, args.shard_records, paced(default_pace))
                + f", sys.setswitchinterval({args.switch_interval})",
                args.shard_records,
                switch_interval=args.switch_interval,
            )
        )
    return variants


def dataset_rows(
    variants: list[DatasetVariant],
    target: LoadedTarget,
    ds: TokenizedDataset,
    source: str,
    args: argparse.Namespace,
    baseline: Callable[[], None],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`capture_dataset` end to end for every variant, --dataset-repeats rounds, interleaved (round r
    runs each variant once, in turn), each run into a fresh folder and right after one timed pass of
    `baseline`, so each run has a ratio to a prefill on the same GPU clock (`paired_ratio_all`).
    One untimed run of the first variant comes first: the first capture of a process page-locks
    fresh host buffers (reported as `cold`). Returns (rows, cold)."""

    def run(v: DatasetVariant) -> tuple[Any, float]:
        shard_dir = Path(tempfile.mkdtemp(prefix="capture_speed_", dir=v.work_root))
        default_interval = sys.getswitchinterval()
        if v.switch_interval > 0:  # a diagnosis row: the library never changes the interpreter's setting
            sys.setswitchinterval(v.switch_interval)
        try:
            t0 = time.perf_counter()
            stats = capture_dataset(
                target,
                ds,
                shard_dir,
                batch_size=args.batch_size,
                max_batch_tokens=args.max_batch_tokens,
                shard_records=v.shard_records,
                write_workers=args.write_workers,
                source=source,
                show_progress=False,
                pace_batches=v.pace_batches,
                max_window_tokens=None
                if v.max_window_batches is None
                else v.max_window_batches * args.max_batch_tokens,
            )
            return stats, time.perf_counter() - t0
        finally:
            sys.setswitchinterval(default_interval)
            if not args.keep_shards:
                shutil.rmtree(shard_dir, ignore_errors=True)

    cold_stats, cold_wall = run(variants[0])
    cold = {"row": variants[0].name, "seconds": cold_stats.seconds, "wall_s": cold_wall}
    log.info("cold capture_dataset (%s, untimed): %.2f s", variants[0].name, cold_stats.seconds)
    runs: dict[str, list[tuple[Any, float, float]]] = {
        v.name: [] for v in variants
    }  # stats, wall, baseline s
    for r in range(max(1, args.dataset_repeats)):
        for v in variants:
            base = timed(baseline, target.device)
            stats, wall = run(v)
            runs[v.name].append((stats, wall, base))
        log.info("capture_dataset round %d/%d done", r + 1, args.dataset_repeats)
    rows = []
    for v in variants:
        done = runs[v.name]
        stats = done[0][0]
        out = result_row(v.name, stats.tokens, [s.seconds for s, _, _ in done], v.what)
        wall = statistics.median(w for _, w, _ in done)
        paired = [b / s.seconds for s, _, b in done if s.seconds > 0]  # capture tok/s over prefill tok/s
        out.update(
            shard_records=v.shard_records,
            pace_batches=v.pace_batches,
            wall_s=wall,
            wall_s_all=[w for _, w, _ in done],
            wall_tokens_per_s=stats.tokens / wall if wall > 0 else 0.0,
            baseline_s_all=[b for _, _, b in done],
            paired_ratio_all=paired,
            paired_ratio=statistics.median(paired) if paired else 0.0,
            shards=stats.shards_written,
            written_bytes=stats.written_bytes,
            write_mb_per_s=stats.written_bytes / out["seconds"] / 1e6 if out["seconds"] > 0 else 0.0,
            phases_all=[
                {k: round(x, 3) for k, x in asdict(s).items() if k.endswith("_seconds")} for s, _, _ in done
            ],
        )
        log.info("%s: %.0f tok/s, %.0f MB/s, paired ratios %s (runs %s s)", v.name, out["tokens_per_s"], out["write_mb_per_s"], [round(x, 3) for x in paired], [round(x, 3) for x in out["seconds_all"]])  # fmt: skip
        for s, _, _ in done:
            log.info("%s: %s", v.name, s.phases())
        rows.append(out)
    return rows, cold
