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
import json
import logging
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from capture_speed_rows import (  # benchmarks/ is the script's folder: on sys.path
    CAPTURE_DEFAULTS,
    Batch,
    dataset_rows,
    dataset_variants,
    memory_rows,
    profile_pass,
    result_row,
    shard_layout,
    timed,
    writer_rows,
)

from eaglewire.bench.report import describe_device, now_iso
from eaglewire.data.batching import MAX_WINDOW_BATCHES, WINDOW_BATCHES, length_batches
from eaglewire.data.build import build_dataset, load_source
from eaglewire.data.capture import human_bytes
from eaglewire.data.capture_batches import launch_shards
from eaglewire.data.records import TokenizedDataset
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget, load_target

log = logging.getLogger("capture_speed")

GOAL_RATIO = 0.70  # issue 4: capture tokens/s >= 70% of pure prefill tokens/s
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
    layout = shard_layout(ds, args)
    variants = memory_rows(target, ds, batches, contract, layout, args)
    passes = {name: fn for name, fn, _ in variants}  # the profile and the end-to-end rows reuse two
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
        profile = None if args.end_to_end_only else profile_pass(passes["capture_records"], device)
    rows: list[dict[str, Any]] = [result_row(name, tokens, seconds[name], what) for name, _, what in variants]
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
                for groups in layout.windows
                for c in launch_shards(
                    target,
                    ds,
                    groups,
                    contract,
                    batch_size=args.batch_size,
                    max_batch_tokens=args.max_batch_tokens,
                ).contents()
            ]
        rows.extend(writer_rows(ds, layout.shards, captured, work_root, args))
        if args.second_work is not None:  # the same into another file system (RAM-backed: not the disk)
            rows.extend(writer_rows(ds, layout.shards, captured, args.second_work, args, suffix="_second"))
        del captured  # freed before the end-to-end runs, which hold their own
    with torch.no_grad():
        end_to_end_rows, cold = dataset_rows(
            dataset_variants(args, work_root), target, ds, source, args, passes["prefill_unmasked"]
        )
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
