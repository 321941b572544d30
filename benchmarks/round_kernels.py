"""Kernel by kernel: what one speculative round's parts cost on the GPU, and how much of a round
the GPU sits idle.

A random-weight target of the reference shape (SmolLM2-135M: speed does not depend on the weights,
so no GGUF is needed) and a random draft of its shape, bf16, batch 1, a `--context`-token prompt.
For each setting (plain, chain 5, trees):

* parts, each replayed `--calls` times back to back under the profiler and by CUDA events: the
  draft round (`Drafter.draft_tree`, one graph), the verify forward of the round's tree with
  greedy verification inside it, and the extend of a verified path; per part the GPU ms per call,
  kernel launches per call, and (`--top`) its kernels by time per call;
* the launch-ahead loop over `--new-tokens` tokens: wall ms per round against kernel ms per round
  (the rest is the GPU waiting for the host).

    PYTHONPATH=src:. python3 benchmarks/round_kernels.py --out $OUT/round_kernels.json   # on a GPU
    PYTHONPATH=src:. python3 benchmarks/round_kernels.py --tiny                          # CPU check
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from benchmarks.loop_profile import per_call_ms, random_draft
from torch.profiler import ProfilerActivity, profile

from eaglewire.contract.numbering import default_boundaries
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.fast.model import TRITON_ATTENTION_MAX_ROWS, KernelChoices
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.verify import StopRule
from eaglewire.target.loading import LoadedTarget

SETTINGS: dict[str, SpecArgs | None] = {
    "plain": None,
    "chain 5": SpecArgs(5, 1, 6),
    "8x8x128": SpecArgs(8, 8, 128),
    "8x12x128": SpecArgs(8, 12, 128),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_table(fn: Callable[[], Any], device: torch.device, calls: int) -> dict[str, Any]:
    """Kernels of `calls` calls of `fn` under the profiler, per call: launches, kernel us, and each
    kernel name's count and us."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        wall_ms = (time.perf_counter() - t0) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        entry = by_name.setdefault(e.name, [0.0, 0.0])
        entry[0] += 1
        entry[1] += e.device_time
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    return {
        "profiled_wall_ms_per_call": wall_ms / calls,
        "launches_per_call": len(kernels) / calls,
        "kernel_us_per_call": sum(e.device_time for e in kernels) / calls,
        "kernels": [
            {"name": name[:110], "count": count / calls, "us": us / calls} for name, (count, us) in ranked
        ],
    }


def part_rows(
    target: LoadedTarget,
    runner: Any,
    drafter: Drafter | None,
    name: str,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """The draft round, the verify forward (+ greedy verification) and an extend, as parts."""
    dev = target.device
    runner.reset(1)
    ctx = args.context
    ids = torch.randint(3, min(1000, target.vocab_size), (1, ctx + 1), device=dev)
    fwd = runner.forward(ids[:, :ctx], torch.arange(ctx, device=dev)[None])
    runner.commit(torch.arange(ctx, device=dev)[None], torch.tensor([ctx], device=dev))
    parts: list[tuple[str, Callable[[], Any]]] = []
    if drafter is None:
        tokens, positions, mask = ids[:, ctx:], torch.full((1, 1), ctx, device=dev), None
    else:
        spec = drafter.spec
        drafter.reset()
        drafter.extend(fwd.aux[0], ids[0, 1 : ctx + 1], start_position=0)
        root = int(ids[0, ctx])
        greedy = SamplingParams()
        tree = drafter.draft_tree(root, ctx, greedy)
        tokens, positions, mask = tree.tokens[None], (tree.depths + ctx)[None], tree.ancestor_mask()[None]
        tokens, positions, mask = tokens.clone(), positions.clone(), mask.clone()  # graph buffers
        parts.append(("draft round", lambda: drafter.draft_tree(root, ctx, greedy)))
        rows = spec.num_steps + 1
        aux = torch.randn(rows, fwd.aux.shape[-1], device=dev, dtype=target.dtype)

        def extend() -> None:
            drafter.committed = ctx - rows
            drafter.extend(aux, ids[0, ctx - rows + 1 : ctx + 1], start_position=ctx - rows)

        parts.append((f"draft extend, {rows} rows", extend))
    reserve = getattr(runner, "reserve_verify_width", None)
    if reserve is not None:
        reserve(tokens.shape[1])
    parts.append(
        (
            f"verify forward, {tokens.shape[1]} nodes",
            lambda: runner.forward(tokens, positions, mask, greedy=True, length_bound=ctx),
        )
    )
    out = []
    for part, fn in parts:
        gpu = per_call_ms(fn, dev, args.calls)[0]  # GPU timeline, median of 5 x `calls`
        table = kernel_table(fn, dev, args.calls)
        out.append({"setting": name, "part": part, "gpu_ms_per_call": gpu, **table})
    return out


def make_fast_runner(target: LoadedTarget, batch: int, attention: str) -> FastTargetRunner:
    """attention: a KernelChoices.attention value, or "triton-decode" (Triton for decode-sized
    forwards only, SDPA for trees: TRITON_ATTENTION_MAX_ROWS)."""
    kc = (
        KernelChoices(attention="triton", triton_attention_max_rows=TRITON_ATTENTION_MAX_ROWS)
        if attention == "triton-decode"
        else KernelChoices(attention=attention)
    )
    return FastTargetRunner(
        target,
        default_boundaries(target.num_layers),
        max_batch_size=batch,
        max_seq_len=1024,
        kernel_choices=kc,
    )


def batched_decode_row(target: LoadedTarget, attention: str, args: argparse.Namespace) -> dict[str, Any]:
    """One decode step of `--batch` rows after a `--context`-token prompt each (what regeneration
    runs), graphed."""
    dev = target.device
    B, ctx = args.batch, args.context
    runner = make_fast_runner(target, B, attention)
    runner.reset(B)
    ids = torch.randint(3, min(1000, target.vocab_size), (B, ctx + 1), device=dev)
    positions = torch.arange(ctx, device=dev)[None].expand(B, ctx)
    runner.forward(ids[:, :ctx], positions)
    runner.commit(positions, torch.full((B,), ctx, device=dev))
    step_positions = torch.full((B, 1), ctx, device=dev)

    def step() -> None:
        runner.forward(ids[:, ctx:], step_positions, length_bound=ctx)

    gpu = per_call_ms(step, dev, args.calls)[0]
    table = kernel_table(step, dev, args.calls)
    return {"setting": f"plain b={B} [{attention}]", "part": "decode step", "gpu_ms_per_call": gpu, **table}


def loop_row(
    target: LoadedTarget, runner: Any, drafter: Drafter | None, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The launch-ahead loop: wall and kernel ms per round."""
    dev = target.device
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(3, min(1000, target.vocab_size), (args.context,), generator=gen).tolist()
    traces: list[Any] = []

    def run() -> None:
        traces.append(
            speculative_generate(
                runner, drafter, prompt, sampling=SamplingParams(), stop=StopRule(args.new_tokens)
            )
        )

    for _ in range(2):
        run()
    walls = []
    for _ in range(3):
        sync(dev)
        t0 = time.perf_counter()
        run()
        sync(dev)
        walls.append((time.perf_counter() - t0) * 1e3)
    rounds = traces[-1].num_verifications
    table = kernel_table(run, dev, 1)
    return {
        "setting": name,
        "loop": traces[-1].loop,
        "rounds": rounds,
        "tokens": len(traces[-1].token_ids),
        "wall_ms_per_round": sorted(walls)[1] / rounds,
        "kernel_ms_per_round": table["kernel_us_per_call"] / 1e3 / rounds,
        "launches_per_round": table["launches_per_call"] / rounds,
        "phase_ms_per_round": {k: v * 1e3 / rounds for k, v in traces[-1].phase_seconds.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny random target on CPU (checks the script)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {list(SETTINGS)}")
    ap.add_argument("--vd", type=int, default=16384)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument(
        "--target-attention",
        default="sdpa,triton,triton-decode",
        help="target attention choices to compare: sdpa, triton (every forward), triton-decode (decode only)",
    )
    ap.add_argument("--batch", type=int, default=256, help="also time one batched decode step (1: no)")
    ap.add_argument("--top", type=int, default=30, help="kernels listed per part")
    ap.add_argument(
        "--inductor-freezing",
        action="store_true",
        help="compile with torch._inductor.config.freezing (weights as constants: fuses q/k/v and gate/up)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.inductor_freezing:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
    if args.tiny:
        from tests.helpers.tiny import make_tiny_target

        target = make_tiny_target("llama")
        args.vd, args.context, args.new_tokens, args.calls, args.batch = 64, 24, 8, 2, 4
        args.target_attention = "sdpa"
        settings = {"plain": None, "chain 5": SpecArgs(5, 1, 6), "tree": SpecArgs(3, 2, 4)}
    else:
        from benchmarks.engine_speed import build_target

        target = build_target("smollm2-135m", torch.device("cuda"), torch.bfloat16)
        settings = {s: SETTINGS[s] for s in args.settings.split(",")}
    draft = random_draft(target, args.vd)
    if target.device.type == "cuda":
        print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    drafters = {
        name: None if spec is None else Drafter(draft, spec, max_seq_len=1024)
        for name, spec in settings.items()
    }
    parts, loops = [], []
    for attention in args.target_attention.split(","):
        runner = make_fast_runner(target, 1, attention)
        for name, drafter in drafters.items():
            label = f"{name} [{attention}]"
            loops.append(loop_row(target, runner, drafter, label, args))
            parts += part_rows(target, runner, drafter, label, args)
            if args.out:  # after every setting: a cut run keeps what it measured
                args.out.write_text(json.dumps({"parts": parts, "loops": loops}, indent=1))
        if args.batch > 1:
            parts.append(batched_decode_row(target, attention, args))
    for p in parts:
        print(
            f"\n== {p['setting']} / {p['part']}: {p['gpu_ms_per_call']:.3f} ms GPU, "
            f"{p['launches_per_call']:.0f} launches, {p['kernel_us_per_call']:.0f} us of kernels"
        )
        for k in p["kernels"][: args.top]:
            print(f"  {k['us']:8.1f} us  x{k['count']:5.1f}  {k['name']}")
    print(f"\n{'setting':<22} {'part':<28} {'GPU ms':>7} {'launches':>8} {'kernel ms':>9}")
    for p in parts:
        print(
            f"{p['setting']:<22} {p['part']:<28} {p['gpu_ms_per_call']:>7.3f} {p['launches_per_call']:>8.0f} "
            f"{p['kernel_us_per_call'] / 1e3:>9.3f}"
        )
    print(
        f"\n{'setting':<22} {'rounds':>6} {'wall ms/round':>13} {'kernel ms/round':>15} {'launches':>8}  phases"
    )
    for r in loops:
        phases = " ".join(f"{k} {v:.3f}" for k, v in r["phase_ms_per_round"].items())
        print(
            f"{r['setting']:<22} {r['rounds']:>6} {r['wall_ms_per_round']:>13.3f} "
            f"{r['kernel_ms_per_round']:>15.3f} {r['launches_per_round']:>8.0f}  {phases}"
        )


if __name__ == "__main__":
    main()
