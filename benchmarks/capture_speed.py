"""Offline hidden-state capture vs the target's pure prefill (issue 4: capture >= 70% of prefill tokens/s).

Measures, on the same records, batched the same way (`eaglewire.data.capture_batches`' longest-first batches
of `--batch-size` rows and at most `--max-batch-tokens` padded tokens), the same model in the same dtype:

  prefill          target forward, next-token logits of the last position only (`logits_to_keep=1`),
                   no KV cache, no hooks, right-padded batches with their padding mask (cuDNN allowed)
  prefill_no_cudnn the same without cuDNN attention (`varying_shape_attention`)
  prefill_unmasked the same batches without the padding mask (causal only: flash attention may run)
                   The goal's baseline ("pure prefill") is the fastest of these three.
  capture_masked   `eaglewire.target.capture.capture` with the padding mask: the forward with the
                   contract's hooks, states concatenated on the device (the library before 2026-12-01)
  capture_states   the same without the mask, as `capture_records` runs it now
  capture_copies   capture_states + each batch's states copied on a copy stream into one pinned host
                   buffer pair allocated once (the copy alone: no allocation, no per-record split)
  capture_records_by_shard `eaglewire.data.capture_batches.launch_shards` shard by shard, each shard's
                   records batched alone: + each record's rows copied on a copy stream into its
                   shard's pinned host buffers; each shard waited for before the next
  capture_records  the same a window at a time: consecutive shards batched together, in the
                   windows capture_dataset plans (data/batching.py: capture_windows)
  capture_pipelined `launch_shards` for window w before waiting for window w - 1 (capture_dataset's
                   order, nothing written)
  write_shards     the shard writer alone: one capture's records (in host memory) written as shards
                   (streamed + sha256) by --write-workers threads into a fresh directory under --work
  write_raw        the same records' states written to files with no header and no sha256 (the disk)
  sha256_only      their sha256 with no file (the hash); both by --write-workers threads
  capture_dataset  `eaglewire.data.capture.capture_dataset` (what `eaglewire data capture` runs), end to end:
                   + safetensors shards, sha256, manifest, into a fresh directory under --work

The in-memory rows run interleaved (every row once per repeat, in turn) after one untimed warm-up
pass each, so a drifting GPU clock touches all rows alike; median of --repeats. The warm-up lets
the masked prefill build its cuDNN plans for these shapes, which a real capture (every batch a new
shape) would not: the baseline is generous. A torch.profiler pass over capture_records (by window) adds its
top host and device operations to the JSON (`profile`).

tokens/s counts real (unpadded) tokens in every row; padding costs the same in all of them. The
in-memory rows are CUDA-synchronised wall times. capture_dataset rows (the library's defaults, and
each --dataset-shard-records / --dataset-max-window-batches / --pace-batches / --second-work /
--switch-interval variant): one untimed cold run first (`cold_capture`: the first capture of a
process page-locks its host buffers), then --dataset-repeats rounds, interleaved, each run timed
by the library itself (`CaptureStats.seconds`, the number the CLI prints; median) and, in
`wall_s`, around the whole call (contract fingerprint and writer setup too). Each run follows one
timed prefill_unmasked pass, so it also has a ratio to a prefill on the same clock
(`paired_ratios`, median per row).

    PYTHONPATH=src:. python3 benchmarks/capture_speed.py --target smollm2 --out capture_speed.json  # GPU
    PYTHONPATH=src:. python3 benchmarks/capture_speed.py --tiny --out /tmp/capture_tiny.json        # CPU check

Dataset: --dataset DIR (a tokenized dataset from `eaglewire data build` or the quickstart's
`<run>/data/train`), else the built-in chitchat train split tokenized here with the target's chat
template (--records conversations, --max-length tokens each). Either way at most --max-tokens tokens
(whole records, in dataset order) are used. Writes --out (JSON) and prints a one-row table last.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import logging
import os
import platform
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

from eaglewire.bench.report import describe_device, now_iso
from eaglewire.data.batching import MAX_WINDOW_BATCHES, WINDOW_BATCHES, capture_windows, length_batches
from eaglewire.data.build import build_dataset, load_source
from eaglewire.data.capture import capture_dataset, human_bytes
from eaglewire.data.capture_batches import launch_shards
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.safetensors_stream import _byte_view
from eaglewire.data.shards import shard_file_name, write_shard
from eaglewire.data.types import ShardContent
from eaglewire.nn.attention import varying_shape_attention
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget, load_target

log = logging.getLogger("capture_speed")

GOAL_RATIO = 0.70  # issue 4: capture tokens/s >= 70% of pure prefill tokens/s
# The defaults `eaglewire data capture` and `capture_dataset` use (one place: the library's signature).
CAPTURE_DEFAULTS = {
    k: v.default
    for k, v in inspect.signature(capture_dataset).parameters.items()
    if k in ("batch_size", "max_batch_tokens", "shard_records", "write_workers", "pace_batches")
}

Batch = tuple[torch.Tensor, torch.Tensor, int]  # ids [B, T], attention mask [B, T], real tokens


# Rows that pass the padding mask: --skip-masked leaves them out.
MASKED_ROWS = ("prefill", "prefill_no_cudnn", "capture_masked")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2", help="HF model directory, .gguf file, or 'smollm2'")
    p.add_argument("--tiny", action="store_true", help="tiny random Llama on CPU: checks this script")
    p.add_argument("--dataset", type=Path, default=None, help="tokenized dataset directory (default: build)")
    p.add_argument(
        "--records", type=int, default=None, help="chitchat conversations to tokenize (default 2000; tiny 64)"
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens per record when building (default 2048; tiny 256)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="use at most this many tokens (default 1,000,000; tiny 20,000)",
    )
    p.add_argument("--batch-size", type=int, default=CAPTURE_DEFAULTS["batch_size"])
    p.add_argument("--max-batch-tokens", type=int, default=CAPTURE_DEFAULTS["max_batch_tokens"])
    p.add_argument("--shard-records", type=int, default=CAPTURE_DEFAULTS["shard_records"])
    p.add_argument("--repeats", type=int, default=5, help="timed passes of the in-memory rows (median)")
    p.add_argument(
        "--dataset-repeats",
        type=int,
        default=2,
        help="capture_dataset runs, each into a fresh folder (median; the first one pays any cold start)",
    )
    p.add_argument(
        "--skip-masked",
        action="store_true",
        help="leave out the rows with a padding mask (prefill, prefill_no_cudnn, capture_masked): "
        "the baseline is then prefill_unmasked, the fastest of the three on the H200",
    )
    p.add_argument(
        "--write-workers",
        type=int,
        default=CAPTURE_DEFAULTS["write_workers"],
        help="shard-writer threads (write_shards and capture_dataset)",
    )
    p.add_argument("--device", default="auto", help="cpu | cuda | auto")
    p.add_argument(
        "--dtype", default="auto", help="float32 | bfloat16 | auto (bfloat16 on CUDA, else float32)"
    )
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="shards go to a fresh folder here (default: $SMOL, else the temp dir)",
    )
    p.add_argument("--keep-shards", action="store_true", help="do not delete the shards afterwards")
    p.add_argument(
        "--second-work",
        type=Path,
        default=None,
        help="also run the writer rows and capture_dataset into this folder (e.g. a RAM-backed one, "
        "to separate the disk from the capture); rows suffixed _second; the goal stays on --work",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        default=0.0005,
        help="also run capture_dataset (on --work) with sys.setswitchinterval(this) as the row "
        "capture_dataset_switch: a shorter GIL switch interval than the default 5 ms shows whether "
        "the writer threads wait for the GIL behind the launching thread; 0 = not run",
    )
    p.add_argument(
        "--pace-batches",
        default="0,1",
        help="also run capture_dataset (on --work) with each of these pace_batches (rows "
        "capture_dataset_pace<N>: the host at most N batches ahead of the GPU, 0 = unbounded; the row "
        f"capture_dataset has the library's {CAPTURE_DEFAULTS['pace_batches']}); '' = none",
    )
    p.add_argument(
        "--dataset-shard-records",
        default="",
        help="also run capture_dataset with each of these shard sizes (rows capture_dataset_shards<N>), "
        "interleaved with the others; '' = none",
    )
    p.add_argument(
        "--dataset-max-window-batches",
        default="",
        help="also run capture_dataset with each of these window ceilings, in full batches (rows "
        f"capture_dataset_maxwindow<N>; the library's is {MAX_WINDOW_BATCHES}; {WINDOW_BATCHES}, the "
        "floor, gives every window the floor's size, the rule before the ceiling), interleaved; '' = none",
    )
    p.add_argument(
        "--end-to-end-only",
        action="store_true",
        help="time only the baseline (prefill_unmasked) and the capture_dataset rows: no other "
        "in-memory rows, no writer rows, no profile (for a short lease)",
    )
    p.add_argument("--out", type=Path, default=Path("capture_speed.json"), help="JSON results")
    return p.parse_args(argv)


def tiny_target(dtype: torch.dtype, device: torch.device) -> LoadedTarget:
    """The tests' tiny random Llama (tests/helpers/tiny.py) with its tiny BPE tokenizer and chat template."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.helpers.tiny import make_tiny_target

    target = make_tiny_target("llama", dtype=dtype)
    target.model.to(device)
    return target


def get_dataset(args: argparse.Namespace, target: LoadedTarget) -> tuple[TokenizedDataset, str]:
    if args.dataset is not None:
        return TokenizedDataset.load(args.dataset), str(args.dataset)
    records = args.records or (64 if args.tiny else 2000)
    max_length = args.max_length or (256 if args.tiny else 2048)
    convs, _ = load_source("builtin:chitchat", split="train", require_assistant=True, limit=records)
    ds, _ = build_dataset(
        convs,
        target.tokenizer,
        max_length=max_length,
        split="train",
        source="builtin:chitchat",
        show_progress=False,
    )
    return ds, f"builtin:chitchat train, first {records} conversations, max_length {max_length}"


def first_tokens(ds: TokenizedDataset, max_tokens: int) -> TokenizedDataset:
    """The leading whole records holding at most `max_tokens` tokens (at least one record)."""
    cum = torch.cumsum(ds.lengths(), 0)
    n = max(1, int((cum <= max_tokens).sum()))
    if n == len(ds):
        return ds
    return TokenizedDataset.from_records([ds[i] for i in range(n)], meta=ds.meta)


def padded_batches(
    ds: TokenizedDataset, batch_size: int, max_batch_tokens: int, device: torch.device
) -> list[Batch]:
    """The batches capture_records forms (its grouping), right-padded, already on `device`."""
    lengths = [int(x) for x in ds.lengths()]
    out: list[Batch] = []
    for group in length_batches(lengths, batch_size, max_batch_tokens):
        width = max(lengths[i] for i in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)  # [B, T]
        attn = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            ids[row, : lengths[i]] = ds[i].input_ids
            attn[row, : lengths[i]] = 1
        out.append((ids.to(device), attn.to(device), sum(lengths[i] for i in group)))
    return out


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
        r = row(
            name + suffix, ds.num_tokens, seconds, f"{what} under {work_root}, {args.write_workers} threads"
        )
        r["write_mb_per_s"] = nbytes / r["seconds"] / 1e6 if r["seconds"] > 0 else 0.0
        log.info("%s: %.0f MB/s (passes %s s)", name, r["write_mb_per_s"], [round(x, 3) for x in seconds])
        rows.append(r)
    return rows


def row(name: str, tokens: int, seconds: list[float], what: str) -> dict[str, Any]:
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
        out = row(v.name, stats.tokens, [s.seconds for s, _, _ in done], v.what)
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    if args.tiny:
        target = tiny_target(getattr(torch, dtype), device)
    else:
        target = load_target(args.target, dtype=dtype, device=device)
    full, source = get_dataset(args, target)
    ds = first_tokens(full, args.max_tokens or (20_000 if args.tiny else 1_000_000))
    batches = padded_batches(ds, args.batch_size, args.max_batch_tokens, device)
    tokens = ds.num_tokens
    padded = sum(int(ids.numel()) for ids, _, _ in batches)
    contract = build_contract(target, None, final_norm="pre", fingerprint=False)
    log.info(
        "%d records, %d tokens (%d padded) in %d batches; aux %s + final %d (pre-norm); %s %s",
        len(ds),
        tokens,
        padded,
        len(batches),
        list(contract.aux_boundaries),
        contract.final.boundary,
        describe_device(device),
        dtype,
    )
    model: Any = target.model

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

    shards = [
        range(lo, min(len(ds), lo + args.shard_records)) for lo in range(0, len(ds), args.shard_records)
    ]
    sizes = dict(batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens)

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

    # capture_dataset's windows: consecutive shards captured together (data/batching.py)
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

    def records_by_shard() -> None:
        for indices in shards:
            launch_shards(target, ds, [indices], contract, **sizes).contents()

    def records_by_window() -> None:
        for groups in windows:
            launch_shards(target, ds, groups, contract, **sizes).contents()

    def records_pipelined() -> None:
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        previous = None
        for groups in windows:
            launched = launch_shards(target, ds, groups, contract, copy_stream=stream, **sizes)
            if previous is not None:
                previous.contents()
            previous = launched
        if previous is not None:
            previous.contents()

    variants: list[tuple[str, Callable[[], None], str]] = [
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
    if args.skip_masked:
        variants = [v for v in variants if v[0] not in MASKED_ROWS]
    if args.end_to_end_only:
        variants = [v for v in variants if v[0] == "prefill_unmasked"]
    seconds: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    with torch.no_grad():
        log.info("warm-up pass of every row")
        for _, fn, _ in variants:
            timed(fn, device)
        for k in range(args.repeats):
            for name, fn, _ in variants:
                seconds[name].append(timed(fn, device))
            log.info("repeat %d/%d done", k + 1, args.repeats)
        profile = None if args.end_to_end_only else profile_pass(records_by_window, device)
    rows: list[dict[str, Any]] = [row(name, tokens, seconds[name], what) for name, _, what in variants]
    for r in rows:
        log.info(
            "%s: %.0f tok/s (passes %s s)",
            r["name"],
            r["tokens_per_s"],
            [round(x, 3) for x in r["seconds_all"]],
        )

    work_root = args.work or Path(os.environ.get("SMOL") or tempfile.gettempdir())
    work_root.mkdir(parents=True, exist_ok=True)
    if args.second_work is not None:
        args.second_work.mkdir(parents=True, exist_ok=True)
    if not args.end_to_end_only:
        with torch.no_grad():  # one capture in host memory for every writer row
            captured = [
                c
                for groups in windows
                for c in launch_shards(target, ds, groups, contract, **sizes).contents()
            ]
        rows.extend(writer_rows(ds, shards, captured, work_root, args))
        if args.second_work is not None:  # the same into another file system (RAM-backed: not the disk)
            rows.extend(writer_rows(ds, shards, captured, args.second_work, args, suffix="_second"))
        del captured  # freed before the end-to-end runs, which hold their own
    what = "eaglewire data capture's library call: + shards written under {}, {} records a shard, {}"

    def paced(depth: int) -> str:
        return f"the host at most {depth} batches ahead of the GPU" if depth else "launches unbounded"

    default_pace = CAPTURE_DEFAULTS["pace_batches"]
    dataset_variants = [
        DatasetVariant(
            "capture_dataset",
            work_root,
            what.format(work_root, args.shard_records, paced(default_pace)),
            args.shard_records,
        )
    ]
    for n in [int(x) for x in args.dataset_shard_records.split(",") if x.strip()]:
        dataset_variants.append(
            DatasetVariant(
                f"capture_dataset_shards{n}", work_root, what.format(work_root, n, paced(default_pace)), n
            )
        )
    for n in [int(x) for x in args.dataset_max_window_batches.split(",") if x.strip()]:
        dataset_variants.append(
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
        dataset_variants.append(
            DatasetVariant(
                "capture_dataset_second",
                args.second_work,
                what.format(args.second_work, args.shard_records, paced(default_pace)),
                args.shard_records,
            )
        )
    for depth in [int(x) for x in args.pace_batches.split(",") if x.strip()]:
        dataset_variants.append(
            DatasetVariant(
                f"capture_dataset_pace{depth}",
                work_root,
                what.format(work_root, args.shard_records, paced(depth)),
                args.shard_records,
                pace_batches=depth,
            )
        )
    if args.switch_interval > 0:
        dataset_variants.append(
            DatasetVariant(
                "capture_dataset_switch",
                work_root,
                what.format(work_root, args.shard_records, paced(default_pace))
                + f", sys.setswitchinterval({args.switch_interval})",
                args.shard_records,
                switch_interval=args.switch_interval,
            )
        )
    with torch.no_grad():
        end_to_end_rows, cold = dataset_rows(dataset_variants, target, ds, source, args, prefill_unmasked)
    rows.extend(end_to_end_rows)
    end_to_end = end_to_end_rows[0]
    # the goal's baseline: the fastest prefill
    baseline = max((r for r in rows if r["name"].startswith("prefill")), key=lambda r: r["tokens_per_s"])
    prefill_tps = baseline["tokens_per_s"]
    ratio = end_to_end["tokens_per_s"] / prefill_tps if prefill_tps else 0.0
    result = {
        "benchmark": "capture_speed",
        "date": now_iso(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "device": describe_device(device),
        "versions": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "transformers": __import__("transformers").__version__,
        },
        "target": "<tiny random llama>" if args.tiny else str(target.path),
        "architecture": target.architecture,
        "dtype": dtype,
        "dataset": source,
        "records": len(ds),
        "tokens": tokens,
        "padded_tokens": padded,
        "batches": len(batches),
        "batch_size": args.batch_size,
        "max_batch_tokens": args.max_batch_tokens,
        "shard_records": args.shard_records,
        "aux_boundaries": list(contract.aux_boundaries),
        "final": {"boundary": contract.final.boundary, "norm": contract.final.norm},
        "bytes_per_token": end_to_end["written_bytes"] / end_to_end["tokens"]
        if end_to_end["tokens"]
        else None,
        "repeats": args.repeats,
        "dataset_repeats": len(end_to_end["seconds_all"]),
        "cold_capture": cold,
        "paired_ratios": {r["name"]: r["paired_ratio"] for r in end_to_end_rows},
        "rows": rows,
        "capture_over_prefill": ratio,
        "capture_wall_over_prefill": end_to_end["wall_tokens_per_s"] / prefill_tps if prefill_tps else 0.0,
        "baseline_row": baseline["name"],
        "goal_ratio": GOAL_RATIO,
        "goal_met": ratio >= GOAL_RATIO,
        "stage_ratios": {r["name"]: r["tokens_per_s"] / prefill_tps if prefill_tps else 0.0 for r in rows},
        "profile": profile,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    print(
        "| device | dtype | tokens | prefill tok/s | capture tok/s | capture/prefill | goal >= 0.70 | shards written |"
    )
    print(
        f"| {result['device']} | {dtype} | {tokens} | {prefill_tps:,.0f} | {end_to_end['tokens_per_s']:,.0f} "
        f"| {ratio:.2f} | {'met' if result['goal_met'] else 'MISSED'} | {human_bytes(end_to_end['written_bytes'])} |"
    )
    print("| capture_dataset row | shard records | median s | vs prefill | paired with its prefill pass |")
    for r in end_to_end_rows:
        print(
            f"| {r['name']} | {r['shard_records']} | {r['seconds']:.3f} | {r['tokens_per_s'] / prefill_tps:.2f} "
            f"| {' '.join(f'{x:.2f}' for x in r['paired_ratio_all'])} (median {r['paired_ratio']:.2f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
