"""Where a training step's time goes: the target side, the draft's forward and backward, the update.

Online training as the GPU quickstart runs it (reference target, bf16, and by default the gpu preset's
draft vocabulary, TTT steps, rows and row length: 16384, 4 since BENCHMARKS.md 2z (7 before), 16 x 1024),
on chitchat train conversations with their own answers (speed does not depend on whose answers they
are), eager and with the draft's forward compiled (`TrainConfig.compile`; it compiles during the
warm-up steps). For each setting it reports, over `--steps` steps after `--warmup`:

* the step's wall time through the loop's own `_train_step`, each step preparing the next one's
  inputs as the loop does (`step_ms`, `tokens_per_s`), and the phases of a step, each ended by a
  device sync: `prepare` (records -> the target's forward(s), its distribution restricted to the
  draft vocab, aux placed into packed rows), `forward` (the unroll and its losses),
  `backward`, `update` (clip + AdamW);
* the summed CUDA kernel time of one profiled step against its wall time, and the top kernels and
  host-side operators.

    python benchmarks/train_profile.py --out train_profile.json     # on a GPU
    python benchmarks/train_profile.py --tiny                       # CPU check of this script
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from eaglewire.data.build import build_dataset
from eaglewire.data.builtin import load_builtin
from eaglewire.data.capture import capture_dataset
from eaglewire.data.shards import ShardDataset
from eaglewire.data.vocab import build_draft_vocab
from eaglewire.draft.init import init_draft
from eaglewire.recipes.presets import PRESETS
from eaglewire.recipes.quickstart_data import first_user_turns
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget, load_target
from eaglewire.train.batches import fetch_rows
from eaglewire.train.config import TrainConfig
from eaglewire.train.distributed import init_distributed
from eaglewire.train.loop import Trainer
from eaglewire.train.objective import batch_step_rows
from eaglewire.train.run import offline_head_dtype, open_data
from eaglewire.train.target_side import OfflineTarget, OnlineTarget, TargetHead


def say(message: str) -> None:
    """A progress line with the time, flushed: a run cut by its timeout shows where it was."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, (time.perf_counter() - t0) * 1e3


def phase_step(trainer: Trainer, rows: list[Any]) -> dict[str, float]:
    """One optimizer step of one micro-batch, split into phases with a sync after each (ms)."""
    device = trainer.ctx.device
    data, side = trainer.data, trainer.target_side
    inp, prepare_ms = _timed(lambda: side.prepare(rows, fetch_rows(data, rows), device), device)
    plan = batch_step_rows(inp.batch, trainer.cfg.ttt_steps)
    w = torch.tensor(trainer.weights, device=device)

    def forward() -> torch.Tensor:
        with trainer.autocast:
            out = trainer.model(inp, rows=plan)
        n = torch.tensor(plan.counts, dtype=torch.float32, device=device).clamp_min(1)
        return (out.loss_sums.float() * w / n).sum()

    loss, forward_ms = _timed(forward, device)
    _, backward_ms = _timed(loss.backward, device)

    def update() -> None:
        torch.nn.utils.clip_grad_norm_(trainer.params, trainer.cfg.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    _, update_ms = _timed(update, device)
    return {
        "prepare_ms": prepare_ms,
        "forward_ms": forward_ms,
        "backward_ms": backward_ms,
        "update_ms": update_ms,
        "tokens": float(inp.batch.num_tokens),
    }


def profile_step(trainer: Trainer, index: int) -> dict[str, Any]:
    """Step `index` of epoch 0 under the profiler, its inputs prepared inside (not overlapped)."""
    device = trainer.ctx.device
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        trainer._train_step(trainer._prepare(0, index))
        _sync(device)
        wall = (time.perf_counter() - t0) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_kernel: dict[str, float] = {}
    for e in kernels:
        by_kernel[e.name] = by_kernel.get(e.name, 0.0) + e.device_time / 1e3
    cpu_ops = sorted(
        (e for e in prof.key_averages() if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total
    )
    return {
        "profiled_wall_ms": wall,
        "kernel_ms": sum(by_kernel.values()),
        "kernel_launches": len(kernels),
        "top_kernels_ms": [
            (n[:90], round(ms, 2)) for n, ms in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:12]
        ],
        "top_host_ops_ms": [
            (e.key[:60], round(e.self_cpu_time_total / 1e3, 2), e.count) for e in cpu_ops[:12]
        ],
    }


def run_setting(
    name: str,
    target: LoadedTarget,
    ds: Any,
    d2t: torch.Tensor,
    config: TrainConfig,
    args: argparse.Namespace,
    shards: ShardDataset | None = None,
) -> dict[str, Any] | None:
    """One setting; with `shards` (ds captured), offline: the records' states read from the shards
    and the labels from the target's head on their final states, as `eaglewire train` on a shard
    directory does, instead of the target's forward in every step."""
    ctx = init_distributed(str(target.device))
    contract = shards.contract if shards is not None else build_contract(target, None, final_norm="pre")
    width = args.draft_intermediate_size or None  # 0: the target's MLP width
    draft = init_draft(target, contract, draft_to_target=d2t, seed=0, intermediate_size=width)
    side: OnlineTarget | OfflineTarget
    if shards is None:
        side = OnlineTarget(target, contract, draft.get_buffer("draft_to_target"))
    else:
        head = TargetHead.from_target(
            target, contract.final, dtype=offline_head_dtype(contract, target.device)
        )
        side = OfflineTarget(head, contract, draft.get_buffer("draft_to_target"), device=target.device)
        ds = shards
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            config, draft, contract, ds, side, out_dir=Path(tmp), eval_data=None, resume=False, ctx=ctx
        )
        groups = trainer.plans[0]
        need = args.warmup + 2 * args.steps + 1
        if len(groups) < need:
            print(f"{name}: skipped: {len(groups)} steps of data, need {need} (raise --conversations)")
            return None
        device = ctx.device
        say(f"{name}: {args.warmup} warm-up + {args.steps} timed steps")
        walls, tokens, warmup_ms = [], [], 0.0
        prepared = trainer._prepare(0, 0)
        for i in range(args.warmup + args.steps):  # as the loop runs: each step prepares the next
            step = lambda p=prepared, i=i: trainer._train_step(p, (0, i + 1))  # noqa: E731
            (_, _, n, prepared), ms = _timed(step, device)
            if i >= args.warmup:
                walls.append(ms)
                tokens.append(n)
            else:
                warmup_ms += ms  # the compiles happen here
                say(f"{name}: warm-up step {i + 1}: {ms / 1e3:.1f} s")
        say(
            f"{name}: {statistics.median(walls):.1f} ms a step after {warmup_ms / 1e3:.1f} s of warm-up; phases"
        )
        phases = [phase_step(trainer, groups[args.warmup + args.steps + i]) for i in range(args.steps)]
        say(f"{name}: profiled step")
        prof = profile_step(trainer, args.warmup + 2 * args.steps)
    med = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    step_ms = statistics.median(walls)
    return {
        "setting": name,
        "data": "offline" if shards is not None else "online",
        "batch_size": config.batch_size,
        "ttt_steps": config.ttt_steps,
        "ttt_attention": config.ttt_attention,
        "draft_intermediate_size": draft.config.intermediate_size,
        "step_ms": step_ms,
        "tokens_per_step": statistics.median(tokens),
        "tokens_per_s": sum(tokens) / (sum(walls) / 1e3),
        "warmup_s": warmup_ms / 1e3,  # the first args.warmup steps, compiles included
        **{k: v for k, v in med.items() if k != "tokens"},
        **prof,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny random target on CPU (checks the script)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--conversations", type=int, default=7168)
    gpu = PRESETS["gpu"]  # the defaults time what the gpu quickstart trains
    ap.add_argument("--vd", type=int, default=gpu.data.draft_vocab_size)
    ap.add_argument("--max-length", type=int, default=gpu.train.max_length)
    ap.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[gpu.train.batch_size]
    )
    ap.add_argument(
        "--compile",
        type=lambda s: [x.strip() == "on" for x in s.split(",")],
        default=None,
        help="TrainConfig.compile settings to compare, e.g. off,on (default off,on; --tiny: off, as "
        "inductor on a CPU needs a C++ toolchain: pass it to check the compiled path there)",
    )
    ap.add_argument(
        "--settings",
        type=lambda s: [(int(b), c.strip() == "on") for b, c in (x.split(":") for x in s.split(","))],
        default=None,
        help="explicit ROWS:off|on pairs, e.g. 16:off,16:on,32:off (instead of every --batch-sizes x --compile)",
    )
    ap.add_argument(
        "--data",
        type=lambda s: [x.strip() for x in s.split(",")],
        default=["online"],
        help="online,offline: also train from shards of the same records, captured once into --work "
        "first (each setting's rows then run both ways; offline rows are named '... offline')",
    )
    ap.add_argument(
        "--attention",
        type=lambda s: [x.strip() for x in s.split(",")],
        default=["blocked"],
        help="TrainConfig.ttt_attention forms to compare, e.g. blocked,flex (flex: CUDA only; its rows "
        "are named '... flex')",
    )
    ap.add_argument("--work", type=Path, default=None, help="where offline shards go (default: temp dir)")
    ap.add_argument("--ttt-steps", type=int, default=gpu.train.ttt_steps)
    ap.add_argument(
        "--draft-intermediate-size",
        type=int,
        default=0,
        help="the draft MLP's width (0: the target's), as quickstart --draft-intermediate-size",
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.tiny:
        from tests.helpers.tiny import make_tiny_target

        target = make_tiny_target("llama")
        args.conversations, args.vd, args.max_length, args.batch_sizes = 60, 64, 96, [2]
        args.compile = args.compile or [False]
        args.ttt_steps, args.warmup, args.steps = 2, 1, 1
    else:
        target = load_target(args.target, dtype="bfloat16", device="cuda")
    args.compile = args.compile or [False, True]
    say(f"building {args.conversations} chitchat conversations")
    convs = [first_user_turns(c, 3) for c in load_builtin("chitchat", "train")[: args.conversations]]
    ds, _ = build_dataset(convs, target.tokenizer, max_length=args.max_length, show_progress=False)
    d2t = build_draft_vocab(ds, args.vd, vocab_size=target.vocab_size).draft_to_target
    bad = sorted(set(args.data) - {"online", "offline"})
    if bad:
        raise SystemExit(f"--data: expected online and/or offline, got {bad}")
    bad = sorted(set(args.attention) - {"blocked", "flex"})
    if bad or ("flex" in args.attention and target.device.type != "cuda"):
        raise SystemExit(
            f"--attention: expected blocked and/or flex (flex on CUDA only), got {args.attention}"
        )
    shards = None
    if "offline" in args.data:
        shard_dir = Path(tempfile.mkdtemp(prefix="train_profile_shards_", dir=args.work))
        say(f"capturing {len(ds)} records ({ds.num_tokens} tokens) into {shard_dir}")
        t0 = time.perf_counter()
        capture_dataset(target, ds, shard_dir, show_progress=False)
        say(f"captured in {time.perf_counter() - t0:.1f} s")
        shards = open_data(shard_dir).records  # as `eaglewire train` opens them (checksums first)
    rows = []
    settings = args.settings or list(itertools.product(args.batch_sizes, args.compile))
    if args.tiny and args.settings:
        settings = [(2, compiled) for _, compiled in args.settings]  # the tiny target's rows
    for (b, compiled), attention in itertools.product(settings, args.attention):
        config = TrainConfig(
            ttt_steps=args.ttt_steps,
            learning_rate=5e-4,
            max_length=args.max_length,
            batch_size=b,
            epochs=1,
            compile=compiled,
            ttt_attention=attention,
        )
        name = (
            f"b{b} s{args.ttt_steps}"
            + (" compiled" if compiled else "")
            + (" flex" if attention == "flex" else "")
        )
        for kind in args.data:
            row = run_setting(
                name + (" offline" if kind == "offline" else ""),
                target,
                ds,
                d2t,
                config,
                args,
                shards if kind == "offline" else None,
            )
            if row is not None:
                rows.append(row)
            if args.out:  # after every setting: a run cut by its timeout keeps the settings it finished
                args.out.write_text(json.dumps(rows, indent=1))
    if shards is not None and args.work is None:
        shutil.rmtree(shards.directory, ignore_errors=True)
    for r in rows:
        print(f"\n== {r['setting']}: top kernels (ms) / host ops (ms, calls)")
        for n, ms in r["top_kernels_ms"]:
            print(f"  {ms:9.2f}  {n}")
        for n, ms, c in r["top_host_ops_ms"]:
            print(f"  {ms:9.2f}  {c:6d}  {n}")
    cols = ["setting", "step_ms", "tokens_per_s", "prepare_ms", "forward_ms", "backward_ms", "update_ms"]
    cols += ["profiled_wall_ms", "kernel_ms", "kernel_launches"]
    print("\n" + " | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    if not rows:  # a profile with nothing in it is a failed step, not an empty success
        print("no setting ran (each was skipped above): nothing measured")
        sys.exit(1)


if __name__ == "__main__":
    main()
