"""Where a decoding loop's time goes: wall time per step against the GPU's kernel time per step.

Two loops on the reference target (SmolLM2-135M-Instruct, bf16):

* speculative rounds at batch 1 (`speculative_generate`): plain (root-only trees on the same
  runner), a chain of 5, a 6x4x16 and an 8x8x64 tree, with a random-weight draft of the target's shape
  (acceptance does not matter here: every round drafts, verifies and commits the same amount),
  each with both round loops: lockstep (the host reads each verdict before it enqueues the next
  round) and launch-ahead (`engine.pipelined`: the next round is enqueued first), ending with a
  table of wall ms per round side by side and whether the two loops produced the same tokens,
  and for each loop the functions where the host spends its time per round (cProfile, `--host-top`):
  with the next round in flight, that host time is what a launch-ahead round still waits for;
* batched plain generation (`generate_plain_with_stats`, what regeneration runs) at several
  batch sizes, every row running to `--new-tokens` (no eos), first call (captures graphs) and
  second call (warm);
* regeneration-like generation: real chat prompts answered until eos, batch by batch against
  continuous batching (`eaglewire.engine.continuous`), tokens/s and whether the tokens agree.

For each, the torch profiler sums the CUDA kernel time of a warm run; wall - kernels is time
the GPU sat idle waiting for the host (Python, launches, synchronisations).

First, the components of one round on a 128-token context, each timed over 20 back-to-back calls
both on the GPU's timeline (CUDA events) and on the host (time to enqueue): target forwards of 1,
6 (chain) and 16 (tree) tokens, greedy verification of 6 and 16 nodes (eagerly, and inside the
forward's CUDA graph with its host read, as the loop now runs it), a chain-5 and a 6x4x16 draft
round, and an extend of 3 rows. When the host is slower than the GPU the two agree.

    python benchmarks/loop_profile.py --out loop_profile.json          # on a GPU
    python benchmarks/loop_profile.py --rounds-only                    # the round loops alone
    python benchmarks/loop_profile.py --tiny                           # CPU check of this script
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from eaglewire.contract.numbering import default_boundaries
from eaglewire.draft.config import draft_config_for_target
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.plain import generate_plain_with_stats
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.verify import StopRule
from eaglewire.target.loading import LoadedTarget, load_target


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_ms(fn: Callable[[], Any], device: torch.device) -> tuple[float, float, list[tuple[str, float]]]:
    """(wall ms, summed CUDA kernel ms, top kernels) of one call of `fn` under the profiler."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        wall = (time.perf_counter() - t0) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in kernels) / 1e3 if kernels else 0.0  # us -> ms
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    return wall, total, [(n[:80], round(ms, 3)) for n, ms in top]


def timed_wall(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def host_functions(
    fn: Callable[[], Any], device: torch.device, rounds: int, top: int
) -> list[dict[str, Any]]:
    """Where the host's time goes in one call of `fn`: the `top` functions by own time under
    cProfile, per round. Time blocked on the GPU shows as the own time of the wait that blocks
    (`Event.synchronize`): when it is small, the loop is bound by this Python, not by the GPU.
    cProfile's own overhead inflates every figure; compare them with each other."""
    _sync(device)
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    _sync(device)
    profiler.disable()
    entries = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    ranked = sorted(entries.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls_per_round": round(nc / rounds, 2),
            "own_us_per_round": round(tt / rounds * 1e6, 1),
            "cumulative_us_per_round": round(ct / rounds * 1e6, 1),
        }
        for (file, line, name), (_cc, nc, tt, ct, _callers) in ranked
    ]


def random_draft(target: LoadedTarget, vd: int) -> Eagle3Draft:
    cfg = draft_config_for_target(target.config, num_aux=3, draft_vocab_size=vd)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    draft.get_buffer("draft_to_target").copy_(torch.arange(vd))
    return draft.to(device=target.device, dtype=target.dtype).eval()


ROUND_LOOPS = (("lockstep", False), ("launch-ahead", True))


def speculative_rows(target: LoadedTarget, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each setting with both round loops on one runner and one drafter (warm-up first: graph
    captures and compiles for every window bucket the prompt reaches, for each loop)."""
    dev = target.device
    runner = make_runner(target, default_boundaries(target.num_layers), "auto", max_seq_len=1024)
    draft = random_draft(target, args.vd)
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(3, min(1000, target.vocab_size), (args.prompt_len,), generator=gen).tolist()
    greedy = SamplingParams()
    rows = []
    settings: list[tuple[str, SpecArgs | None]] = [
        ("plain (same loop)", None),
        ("chain 5", SpecArgs(5, 1, 6)),
        ("tree 6x4x16", SpecArgs(6, 4, 16)),
        ("tree 8x8x64", SpecArgs(8, 8, 64)),  # the GPU preset's tree since run 6's sweep
    ]
    for name, spec in settings:
        drafter = None if spec is None else Drafter(draft, spec, max_seq_len=1024)
        tokens: dict[str, list[int]] = {}
        for loop, ahead in ROUND_LOOPS:
            traces: list[Any] = []

            def run(
                drafter: Drafter | None = drafter, ahead: bool = ahead, traces: list[Any] = traces
            ) -> None:
                traces.append(
                    speculative_generate(
                        runner,
                        drafter,
                        prompt,
                        sampling=greedy,
                        stop=StopRule(args.new_tokens),
                        launch_ahead=ahead,
                    )
                )

            for _ in range(3):
                run()
            walls = sorted(timed_wall(run, dev) for _ in range(3))
            wall_prof, kern, top = kernel_ms(run, dev)
            n = traces[-1].num_verifications
            tokens[loop] = traces[-1].token_ids
            rows.append(
                {
                    "loop": f"speculative b=1 {loop}",
                    "setting": name,
                    "round_loop": traces[-1].loop,
                    "rounds": n,
                    "wall_ms_per_round": walls[1] / n,
                    "kernel_ms_per_round": kern / n,
                    "idle_ms_per_round": (wall_prof - kern) / n,
                    "profiled_wall_ms_per_round": wall_prof / n,
                    "top_kernels_ms": top,
                    "host_functions": host_functions(run, dev, n, args.host_top) if args.host_top else [],
                }
            )
        # bf16: the launch-ahead extend feeds a round's P path rows, not its n accepted ones, so a
        # near-tie in the draft can part the two loops' trees (float32 tests show equality)
        rows[-1]["same_tokens_as_lockstep"] = tokens["launch-ahead"] == tokens["lockstep"]
    return rows


def print_round_loops(rows: list[dict[str, Any]]) -> None:
    """The two round loops side by side: wall ms per round (median of 3 warm runs)."""
    by = {(r["setting"], r["loop"].removeprefix("speculative b=1 ")): r for r in rows if "round_loop" in r}
    print("round loops at batch 1: wall ms per round (median of 3 warm runs)")
    print(f"{'setting':<20} {'lockstep':>9} {'launch-ahead':>13} {'saved':>7} {'kernel ms':>10}  same tokens")
    for setting in dict.fromkeys(s for s, _ in by):
        lock, ahead = by[(setting, "lockstep")], by[(setting, "launch-ahead")]
        saved = lock["wall_ms_per_round"] - ahead["wall_ms_per_round"]
        print(
            f"{setting:<20} {lock['wall_ms_per_round']:>9.3f} {ahead['wall_ms_per_round']:>13.3f} "
            f"{saved:>7.3f} {ahead['kernel_ms_per_round']:>10.3f}  {ahead['same_tokens_as_lockstep']}"
        )


def print_host_functions(rows: list[dict[str, Any]]) -> None:
    """Each round loop's top functions by the host's own time per round (cProfile)."""
    for r in rows:
        if not r.get("host_functions"):
            continue
        print(f"host time per round, {r['loop']} / {r['setting']} (cProfile: own us, cumulative us, calls)")
        for f in r["host_functions"]:
            print(
                f"  {f['own_us_per_round']:>8.1f} {f['cumulative_us_per_round']:>9.1f} "
                f"{f['calls_per_round']:>6.2f}  {f['function']}"
            )


def per_call_ms(
    fn: Callable[[], Any], device: torch.device, calls: int = 20, repeats: int = 5
) -> tuple[float, float]:
    """(GPU-timeline ms per call by CUDA events, host ms per call to enqueue it), medians, after warm-up.
    When the host is slower than the GPU the two agree; otherwise the first is the GPU's time."""
    for _ in range(3):
        fn()
    gpu, host = [], []
    for _ in range(repeats):
        _sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) * 1e3 / calls)
        if device.type == "cuda":
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end) / calls)
        else:
            _sync(device)
            gpu.append(host[-1])
    return sorted(gpu)[len(gpu) // 2], sorted(host)[len(host) // 2]


def component_rows(target: LoadedTarget, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The pieces of one round on a 128-token context: target forwards of 1, 6 (chain) and 16 (tree)
    tokens, greedy verification of 6 and 16 nodes (one host read each), a chain-5 and a 6x4x16 draft,
    an extend of 3 rows."""
    from eaglewire.engine.runners.protocol import commit_leading
    from eaglewire.engine.tree import tree_from_parents
    from eaglewire.engine.verify import verdict_from_path, verify_greedy

    dev = target.device
    runner = make_runner(target, default_boundaries(target.num_layers), "auto", max_seq_len=1024)
    runner.reset(1)
    context = args.prompt_len
    ids = torch.randint(3, min(1000, target.vocab_size), (1, context), device=dev)
    runner.forward(ids, torch.arange(context, device=dev)[None])
    commit_leading(runner, torch.tensor([context]), context)
    rows: list[dict[str, Any]] = []

    def add(name: str, fn: Callable[[], Any]) -> None:
        gpu, host = per_call_ms(fn, dev)
        rows.append({"loop": "component", "setting": name, "gpu_ms": gpu, "host_ms": host})

    chain = tree_from_parents(torch.arange(6, device=dev) + 5, torch.arange(-1, 5, device=dev))
    parents16 = torch.tensor([-1, 0, 0, 0, 0, 1, 1, 2, 2, 3, 5, 5, 7, 10, 10, 13], device=dev)
    tree = tree_from_parents(torch.arange(16, device=dev) + 5, parents16)
    for name, t in (("1 token", None), ("6-token chain", chain), ("16-node tree", tree)):
        n = 1 if t is None else t.num_nodes
        tok = torch.full((1, n), 7, device=dev)
        pos = (t.depths if t is not None else torch.zeros(1, dtype=torch.long, device=dev)) + context
        mask = None if t is None else t.ancestor_mask()[None]
        add(
            f"target forward, {name}",
            lambda tok=tok, pos=pos, mask=mask: runner.forward(tok, pos[None], mask),
        )
        if t is not None:
            logits = runner.forward(tok, pos[None], mask).logits[0]
            add(f"greedy verification, {name}", lambda t=t, logits=logits: verify_greedy(t, logits))

            def in_graph(tok: torch.Tensor = tok, pos: torch.Tensor = pos, mask: Any = mask) -> None:
                fwd = runner.forward(tok, pos[None], mask, greedy=True)
                assert fwd.greedy is not None
                verdict_from_path(fwd.greedy[0])

            add(f"forward + verification in its graph, {name}", in_graph)
    draft = random_draft(target, args.vd)
    aux = torch.randn(context, 3 * target.hidden_size, device=dev, dtype=target.dtype)
    for name, spec in (("chain 5", SpecArgs(5, 1, 6)), ("tree 6x4x16", SpecArgs(6, 4, 16))):
        drafter = Drafter(draft, spec, max_seq_len=1024)
        drafter.extend(aux[:-3], ids[0, 1 : context - 2], start_position=0)
        add(f"draft_tree, {name}", lambda d=drafter: d.draft_tree(7, context, SamplingParams()))
        if spec.is_chain:

            def extend(d: Drafter = drafter) -> None:
                d.committed = context - 3
                d.extend(aux[-3:], ids[0, -3:], start_position=context - 3)

            add("draft extend, 3 rows", extend)
    return rows


def plain_batch_rows(target: LoadedTarget, args: argparse.Namespace) -> list[dict[str, Any]]:
    dev = target.device
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(1)
    for B in args.batches:
        lens = torch.randint(args.prompt_len // 2, args.prompt_len + 1, (B,), generator=gen).tolist()
        prompts = [torch.randint(3, min(1000, target.vocab_size), (n,), generator=gen).tolist() for n in lens]
        runner = make_runner_batched(target, B, args.prompt_len + args.new_tokens)
        stats: list[Any] = []

        def run(prompts: list[list[int]] = prompts, runner: Any = runner, stats: list[Any] = stats) -> None:
            stats.append(generate_plain_with_stats(runner, prompts, args.new_tokens, eos_token_ids=()))

        cold = timed_wall(run, dev)
        warm = timed_wall(run, dev)
        wall_prof, kern, top = kernel_ms(run, dev)
        steps = stats[-1].forwards
        rows.append(
            {
                "loop": f"plain batched b={B}",
                "setting": f"{args.new_tokens} new tokens, prompts {min(lens)}-{max(lens)}",
                "rounds": steps,
                "cold_s": cold / 1e3,
                "warm_s": warm / 1e3,
                "tokens_per_s_warm": B * args.new_tokens / (warm / 1e3),
                "prefill_s": stats[-1].prefill_seconds,
                "wall_ms_per_round": (warm - stats[1].prefill_seconds * 1e3) / steps,
                "kernel_ms_per_round": kern / steps,
                "idle_ms_per_round": (wall_prof - kern) / steps,
                "profiled_wall_ms_per_round": wall_prof / steps,
                "top_kernels_ms": top,
            }
        )
        del runner
    return rows


def regeneration_rows(target: LoadedTarget, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Regeneration-like generation: real chat prompts (first chitchat user turns, the chat template),
    answers ending at eos or `--regen-new-tokens`, batch by batch vs continuous batching, same runner.
    Greedy, so both produce the same tokens (in float32; in bf16 a row's rounding depends on its batch); each is run twice and the second (warm) run is timed."""
    from eaglewire.data.builtin import load_builtin

    tok = target.tokenizer
    convs = load_builtin("chitchat", "train")[: args.regen_prompts]
    prompts = []
    for c in convs:
        text = tok.apply_chat_template(
            [{"role": "user", "content": c.messages[0].content}], tokenize=False, add_generation_prompt=True
        )
        prompts.append([int(t) for t in tok(text, add_special_tokens=False)["input_ids"]][:512])
    runner = make_runner_batched(target, args.regen_rows, 512 + args.regen_new_tokens)
    rows, outputs = [], {}
    for continuous in (False, True):
        results: list[Any] = []

        def run(continuous: bool = continuous, results: list[Any] = results) -> None:
            results.append(
                generate_plain_with_stats(
                    runner,
                    prompts,
                    args.regen_new_tokens,
                    max_batch_size=args.regen_rows,
                    continuous=continuous,
                )
            )

        timed_wall(run, target.device)
        warm = timed_wall(run, target.device)
        r = results[-1]
        outputs[continuous] = r.tokens
        rows.append(
            {
                "loop": f"regeneration b={args.regen_rows}",
                "setting": "continuous" if continuous else "batch by batch",
                "rounds": r.forwards,
                "seconds": warm / 1e3,
                "new_tokens": r.new_tokens,
                "tokens_per_s_warm": r.new_tokens / (warm / 1e3),
                "wall_ms_per_round": warm / max(r.forwards, 1),
                "kernel_ms_per_round": float("nan"),
                "idle_ms_per_round": float("nan"),
            }
        )
    rows[-1]["same_tokens_as_batched"] = outputs[True] == outputs[False]
    # bf16: rows batched differently round differently, and greedy answers can part after a near-tie
    same = sum(a == b for a, b in zip(outputs[True], outputs[False], strict=True))
    rows[-1]["prompts_with_same_tokens"] = f"{same}/{len(prompts)}"
    return rows


def make_runner_batched(target: LoadedTarget, batch: int, max_seq_len: int) -> Any:
    from eaglewire.engine.runners.factory import make_runner

    return make_runner(target, (), max_batch_size=batch, max_seq_len=max_seq_len)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny random target on CPU (checks the script)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--vd", type=int, default=16384)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[256])
    ap.add_argument("--regen-prompts", type=int, default=1024, help="regeneration rows: chat prompts")
    ap.add_argument("--regen-rows", type=int, default=256, help="regeneration rows: runner batch")
    ap.add_argument("--regen-new-tokens", type=int, default=256)
    ap.add_argument("--rounds-only", action="store_true", help="only the speculative round loops")
    ap.add_argument(
        "--host-top", type=int, default=15, help="per round loop, this many functions by host time (0: none)"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.tiny:
        from tests.helpers.tiny import make_tiny_target

        target = make_tiny_target("llama")
        args.vd, args.prompt_len, args.new_tokens, args.batches = 64, 16, 8, [4]
        args.regen_prompts, args.regen_rows, args.regen_new_tokens = 12, 4, 8
    else:
        target = load_target(args.target, dtype="bfloat16", device="cuda")
    rows = speculative_rows(target, args)
    components = [] if args.rounds_only else component_rows(target, args)
    if not args.rounds_only:
        rows += plain_batch_rows(target, args) + regeneration_rows(target, args)
    if args.out:
        args.out.write_text(json.dumps(rows + components, indent=1))
    for r in components:
        print(
            f"{r['setting']:<40} GPU timeline {r['gpu_ms']:7.3f} ms/call   host {r['host_ms']:7.3f} ms/call"
        )
    for r in rows:
        for k, v in r.items():
            if k != "top_kernels_ms":
                continue
            print(f"{r['loop']} / {r['setting']} top kernels (ms): {v}")
    print(f"{'loop':<28} {'setting':<34} {'steps':>6} {'wall ms':>8} {'kernel ms':>9} {'idle ms':>8}")
    for r in rows:
        print(
            f"{r['loop']:<28} {r['setting']:<34} {r['rounds']:>6} {r['wall_ms_per_round']:>8.3f} "
            f"{r['kernel_ms_per_round']:>9.3f} {r['idle_ms_per_round']:>8.3f}"
            + (f"  {r['tokens_per_s_warm']:.0f} tok/s (cold {r['cold_s']:.1f}s)" if "cold_s" in r else "")
            + (f"  {r['tokens_per_s_warm']:.0f} tok/s" if r["loop"].startswith("regeneration") else "")
            + (
                f"  same tokens: {r['prompts_with_same_tokens']} prompts"
                if "prompts_with_same_tokens" in r
                else ""
            )
        )

    print_host_functions(rows)
    print()
    print_round_loops(rows)


if __name__ == "__main__":
    main()
