"""Target-runtime speed: plain decode tokens/s and the cost of verifying k tokens vs decoding one.

Random-weight models built from configs (weights do not change speed):
  smollm2-135m   SmolLM2-135M shape (Llama, hidden 576, 30 layers, 9/3 heads, vocab 49152, tied)
  llama-3.1-8b   Llama-3.1-8B shape (hidden 4096, 32 layers, 32/8 heads, vocab 128256, llama3 RoPE)
  tiny           a few-layer model for checking this script on CPU

    python benchmarks/engine_speed.py --models smollm2-135m,llama-3.1-8b --out results.json   # on a GPU
    python benchmarks/engine_speed.py --tiny                                                   # CPU check

Speed at length (`--context-tokens 0,1024,4096,8064`): decode(1) and verify(k) for k in
`--context-ks` (default 1,16,64,128) with that many tokens already in the KV cache (the forward
attends to all of them), per context: the ms, verify(k)/decode(1), `context_share` (the part of
the forward's ms that the context added over the shortest context timed: attention over the cache,
measured by difference) and, on CUDA, `attention_share` (the profiler's attention kernels' share of
the forward's kernel time). Each context + the widest k must fit the shape's positions (exit 2
otherwise); the runner's max_seq_len grows to hold the longest. Without the flag nothing changes.

Timings: CUDA events after warm-up, median of repeats. Prints a table last.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from eaglewire.cli.common import run_script
from eaglewire.contract.numbering import default_boundaries
from eaglewire.engine.plain import generate_plain_with_stats
from eaglewire.engine.runners.fast.model import KernelChoices
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.runners.fast.weights import weight_bytes
from eaglewire.errors import ConfigError
from eaglewire.target.loading import LoadedTarget

HBM_BYTES_PER_S = 4.3e12  # the H200 figure (a device-to-device copy measures about this)

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        rms_norm_eps=1e-5,
    ),
    "llama-3.1-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        rms_norm_eps=1e-5,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-5,
    ),
}


def build_target(name: str, device: torch.device, dtype: torch.dtype) -> LoadedTarget:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**SHAPES[name], architectures=["LlamaForCausalLM"], eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval().requires_grad_(False)
    return LoadedTarget(model=model, tokenizer=None, path=Path(f"<random {name}>"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device, iters: int, repeats: int) -> float:
    """Median over `repeats` of the mean ms per call of `iters` back-to-back calls."""
    fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1000 / iters)
    return statistics.median(samples)


def copy_bandwidth(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    src = torch.randn(256 * 1024 * 1024, device=device, dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, iters=5, repeats=5)
    return 2 * src.numel() * 4 / (ms / 1000)


def prefill(runner: FastTargetRunner, prompt: torch.Tensor) -> None:
    runner.reset(1)
    T = prompt.shape[1]
    runner.forward(prompt, torch.arange(T, device=prompt.device)[None])
    runner.commit_prefix(torch.tensor([T]))


def verify_costs(
    runner: FastTargetRunner, prompt: torch.Tensor, ks: list[int], iters: int, repeats: int
) -> dict[str, float]:
    """ms of one forward of k new tokens (chain tree mask; k=1: plain decode step, no mask) at the
    prompt's length, without commit (the same provisional slots are rewritten)."""
    prefill(runner, prompt)
    return forwards_after(runner, prompt.shape[1], ks, iters, repeats)


def forwards_after(
    runner: FastTargetRunner, start: int, ks: list[int], iters: int, repeats: int
) -> dict[str, float]:
    """ms of one uncommitted forward of k random tokens at positions start.. (chain tree mask; k=1 no mask), per k."""
    dev = runner.device
    out = {}
    for k in ks:
        ids = torch.randint(0, runner.vocab_size, (1, k), device=dev)
        pos = (start + torch.arange(k, device=dev))[None]
        tree = torch.ones(1, k, k, dtype=torch.bool, device=dev).tril() if k > 1 else None
        out[str(k)] = time_ms(
            lambda ids=ids, pos=pos, tree=tree: runner.forward(ids, pos, tree), dev, iters, repeats
        )
    return out


def fill_context(runner: FastTargetRunner, context_tokens: int, seed: int = 2) -> None:
    """An empty cache, then `context_tokens` random tokens prefilled and committed (logits of the
    last one only: an 8k prefill's full logits would be gigabytes); 0 leaves the cache empty."""
    runner.reset(1)
    if context_tokens == 0:
        return
    dev = runner.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(3, runner.vocab_size, (1, context_tokens), generator=gen).to(dev)
    last = torch.tensor([context_tokens - 1], device=dev)
    runner.forward(ids, torch.arange(context_tokens, device=dev)[None], logits_at=last)
    runner.commit_prefix(torch.tensor([context_tokens]))


def context_forward_ms(
    runner: FastTargetRunner, context_tokens: int, ks: list[int], iters: int, repeats: int
) -> dict[str, float]:
    """ms of one forward of k new tokens after `context_tokens` committed ones (chain tree mask; k=1:
    a plain decode step), for each k; without commit, so every call attends to the same cache."""
    fill_context(runner, context_tokens)
    return forwards_after(runner, context_tokens, ks, iters, repeats)


def check_contexts(models: list[str], contexts: list[int], ks: list[int]) -> None:
    """Each context >= 0 and, with the widest k, within every model's positions; a ConfigError
    naming --context-tokens and the lengths otherwise (before any model is built)."""
    bad = [c for c in contexts if c < 0]
    if bad:
        raise ConfigError(f"--context-tokens: expected tokens >= 0, got {bad}")
    if not ks or min(ks) < 1:
        raise ConfigError(f"--context-ks: expected widths >= 1, got {ks}")
    for name in models:
        positions = int(SHAPES[name]["max_position_embeddings"])
        over = [c for c in contexts if c + max(ks) > positions]
        if over:
            raise ConfigError(
                f"--context-tokens {over[0]}: {over[0]} cached tokens + a verify of {max(ks)} (--context-ks) "
                f"= {over[0] + max(ks)} positions; the {name} shape has {positions} (max_position_embeddings)",
                fix=f"use contexts <= {positions - max(ks)} for {name}",
            )


def context_sweep(runner: FastTargetRunner, args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Per context of --context-tokens: forward ms per --context-ks width, verify(k)/decode(1), the
    context's share of each forward (by difference from the shortest context timed) and, on CUDA,
    the attention kernels' share of decode(1) and of the widest verify (profiler)."""
    ks = sorted(set(args.context_ks))
    contexts = sorted(set(args.context_tokens))
    out: dict[str, Any] = {}
    for c in contexts:
        fm = context_forward_ms(runner, c, ks, args.iters, args.repeats)
        ratios = {k: v / fm["1"] for k, v in fm.items()} if "1" in fm else {}
        row: dict[str, Any] = {"forward_ms": fm, "verify_over_decode": ratios}
        if runner.device.type == "cuda":
            shares = {}
            for k in dict.fromkeys((1, ks[-1])):
                try:
                    fill_context(runner, c)
                    prof = kernel_profile_filled(runner, c, k)
                    attention = prof["by_category"].get("attention", {"us": 0.0})["us"]
                    shares[str(k)] = attention / max(prof["kernel_us_per_forward"], 1e-9)
                except Exception as err:  # noqa: BLE001 - profiling is best effort
                    shares[str(k)] = f"{type(err).__name__}: {err}"
            row["attention_share"] = shares
        out[str(c)] = row
        print(f"[{name}] context {c}: forward ms {fm}", flush=True)
    base = out[str(contexts[0])]["forward_ms"]
    for row in out.values():
        row["context_share"] = {
            k: max(v - base[k], 0.0) / v if v > 0 else 0.0 for k, v in row["forward_ms"].items()
        }
    return out


def _category(name: str) -> str:
    n = name.lower()
    if any(x in n for x in ("fmha", "attention", "flash", "attn")):
        return "attention"
    if any(x in n for x in ("gemv", "gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")):
        return "matmul"
    if "triton" in n:
        return "fused (triton)"
    return "other"


def kernel_profile(runner: FastTargetRunner, prompt: torch.Tensor, k: int, reps: int = 5) -> dict[str, Any]:
    """Kernels of one forward of k tokens (CUDA profiler over `reps` replays): count and summed
    device time per category; the rest of the measured time is gaps between kernels."""
    prefill(runner, prompt)
    return kernel_profile_filled(runner, prompt.shape[1], k, reps)


def kernel_profile_filled(
    runner: FastTargetRunner, context_tokens: int, k: int, reps: int = 5
) -> dict[str, Any]:
    """`kernel_profile` of a forward of k tokens after the `context_tokens` the cache already holds."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    dev = runner.device
    T = context_tokens
    ids = torch.randint(0, runner.vocab_size, (1, k), device=dev)
    pos = (T + torch.arange(k, device=dev))[None]
    tree = torch.ones(1, k, k, dtype=torch.bool, device=dev).tril() if k > 1 else None
    runner.forward(ids, pos, tree)
    sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            runner.forward(ids, pos, tree)
        sync(dev)
    cats: dict[str, list[float]] = {}
    names: dict[str, float] = {}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us()
        c = cats.setdefault(_category(e.name), [0.0, 0.0])
        c[0] += 1
        c[1] += us
        names[e.name] = names.get(e.name, 0.0) + us
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    return {
        "kernels_per_forward": sum(c[0] for c in cats.values()) / reps,
        "kernel_us_per_forward": sum(c[1] for c in cats.values()) / reps,
        "by_category": {k: {"kernels": c[0] / reps, "us": c[1] / reps} for k, c in cats.items()},
        "top_kernels_us": {n[:90]: us / reps for n, us in top},
    }


def hf_ms_per_token(target: LoadedTarget, prompt: torch.Tensor, n: int) -> float:
    model, dev = target.model, target.device
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def run(m: int) -> float:
        sync(dev)
        t0 = time.perf_counter()
        model.generate(prompt, max_new_tokens=m, min_new_tokens=m, **kw)
        sync(dev)
        return time.perf_counter() - t0

    run(2)
    return (run(n + 1) - run(1)) * 1000 / n


def parity(
    target: LoadedTarget, runner: FastTargetRunner, prompt: torch.Tensor, steps: int, fp32_ref: bool
) -> dict[str, Any]:
    """bf16 logits vs transformers on the prompt; greedy agreement of `steps` tokens with HF generate."""
    with torch.no_grad():
        ref = target.model(prompt).logits.float()[0, -1]
        ref32 = None
        if fp32_ref and target.dtype != torch.float32:
            model32 = copy.deepcopy(target.model).float()
            ref32 = model32(prompt).logits.float()[0, -1]
            del model32
    runner.reset(1)
    T = prompt.shape[1]
    out = runner.forward(prompt, torch.arange(T, device=prompt.device)[None])
    got = out.logits[0, -1]
    rel = float((got - ref).norm() / ref.norm())
    res = generate_plain_with_stats(runner, [prompt[0].tolist()], steps, eos_token_ids=())
    hf = target.model.generate(
        prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0
    )
    hf_tokens = hf[0, T:].tolist()
    ours = res.tokens[0]
    agree = next(
        (i for i, (a, b) in enumerate(zip(ours, hf_tokens, strict=False)) if a != b),
        min(len(ours), len(hf_tokens)),
    )
    out_d: dict[str, Any] = {
        "prefill_logits_rel_err": rel,
        "greedy_tokens_equal_prefix": agree,
        "greedy_steps": steps,
    }
    if ref32 is not None:
        out_d["ours_vs_fp32_rel_err"] = float((got - ref32).norm() / ref32.norm())
        out_d["hf_bf16_vs_fp32_rel_err"] = float((ref - ref32).norm() / ref32.norm())
    return out_d


def dev_is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


CHOICE_KEYS = {
    "sdpa": "sdpa_backend",
    "mm_rows": "reduction_matmul_max_rows",
    "mm_bytes": "reduction_matmul_max_bytes",
    "attn_rows": "reduction_attention_max_rows",
    "attn": "attention",  # auto | triton | sdpa
    "triton_rows": "triton_attention_max_rows",
}


def parse_variants(text: str) -> list[tuple[str, str, dict[str, Any]]]:
    """'model/label=key:val+key:val,...' -> [(model, label, settings)]; keys: mm_rows, mm_bytes,
    attn_rows (KernelChoices), cudnn_sdp (0/1, global SDPA backend switch), else inductor options."""
    out = []
    for item in filter(None, text.split(",")):
        target_label, _, opts = item.partition("=")
        model, _, label = target_label.partition("/")
        parsed: dict[str, Any] = {}
        for kv in filter(None, opts.split("+")):
            key, _, val = kv.partition(":")
            parsed[key] = int(val) if val.lstrip("-").isdigit() else val
        out.append((model, label, parsed))
    return out


def bench_model(
    name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, deadline: float
) -> dict[str, Any]:
    res: dict[str, Any] = {"shape": SHAPES[name]}
    t0 = time.perf_counter()
    target = build_target(name, device, dtype)
    res["build_s"] = time.perf_counter() - t0
    L = target.num_layers
    t0 = time.perf_counter()
    runner = FastTargetRunner(
        target,
        default_boundaries(L),
        max_batch_size=1,
        max_seq_len=runner_seq_len(args),
        compile=args.compile if args.compile is not None else None,
    )
    res["max_seq_len"] = runner.max_seq_len
    res["weight_bytes_read_per_token"] = weight_bytes(runner.weights)
    total_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    res["weight_bytes_total"] = total_bytes
    res["hbm_floor_ms"] = total_bytes / HBM_BYTES_PER_S * 1000
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(3, target.vocab_size, (1, args.prompt_len), generator=gen).to(device)
    if not args.skip_parity:
        res["parity"] = parity(target, runner, prompt[:, :64], args.parity_steps, args.fp32_ref)
        res["first_compile_and_capture_s"] = time.perf_counter() - t0
        print(f"[{name}] parity {res['parity']}", flush=True)
    # plain decode through generate_plain (argmax + bookkeeping included), after a warm run
    prompt_ids = [prompt[0].tolist()]
    generate_plain_with_stats(runner, prompt_ids, args.new_tokens, eos_token_ids=())
    plain = generate_plain_with_stats(runner, prompt_ids, args.new_tokens, eos_token_ids=())
    res["plain_decode_tok_s"] = plain.decode_tokens_per_s
    res["plain_decode_ms_per_token"] = 1000 / plain.decode_tokens_per_s
    res["graphs_captured"] = len(runner._graphs) if runner._graphs is not None else 0
    print(f"[{name}] plain decode {plain.decode_tokens_per_s:.1f} tok/s", flush=True)
    if time.perf_counter() > deadline:
        res["skipped"] = "verify and HF (time budget)"
        return res
    ks = [k for k in args.ks if k <= args.max_k]
    res["forward_ms"] = verify_costs(runner, prompt, ks, args.iters, args.repeats)
    base = res["forward_ms"]["1"]
    res["verify_over_decode"] = {k: v / base for k, v in res["forward_ms"].items()}
    res["decode_ms_over_hbm_floor"] = base / res["hbm_floor_ms"]
    print(f"[{name}] forward ms {res['forward_ms']}", flush=True)
    if dev_is_cuda(device) and time.perf_counter() < deadline:
        for k in (1, 16):
            try:
                res[f"profile_k{k}"] = kernel_profile(runner, prompt, k)
                prof = res[f"profile_k{k}"]
                print(
                    f"[{name}] k={k}: {prof['kernels_per_forward']:.0f} kernels, "
                    f"{prof['kernel_us_per_forward']:.0f} us kernel time; {prof['by_category']}",
                    flush=True,
                )
            except Exception as err:  # noqa: BLE001 - profiling is best effort
                res[f"profile_k{k}"] = {"error": f"{type(err).__name__}: {err}"}
    if time.perf_counter() < deadline and args.hf_tokens > 0:
        res["hf_generate_ms_per_token"] = hf_ms_per_token(target, prompt, args.hf_tokens)
        print(f"[{name}] HF generate {res['hf_generate_ms_per_token']:.2f} ms/token", flush=True)
    if args.context_tokens:
        if time.perf_counter() < deadline:
            res["by_context"] = context_sweep(runner, args, name)
        else:
            res["by_context"] = {"skipped": "time budget"}
    del runner, target
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def runner_seq_len(args: argparse.Namespace) -> int:
    """--max-seq-len, or more where --context-tokens needs room for its longest context and widest k."""
    if not args.context_tokens:
        return int(args.max_seq_len)
    return max(int(args.max_seq_len), max(args.context_tokens) + max(args.context_ks))


def bench_variants(
    name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, deadline: float
) -> dict[str, Any]:
    """Forward k in --variant-ks with other kernel choices / inductor options (after the main runs)."""
    res: dict[str, Any] = {}
    target = build_target(name, device, dtype)
    L = target.num_layers
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(3, target.vocab_size, (1, args.prompt_len), generator=gen).to(device)
    for model, label, settings in args.variants:
        if model != name:
            continue
        if time.perf_counter() > deadline:
            res[label] = {"skipped": "time budget"}
            continue
        t1 = time.perf_counter()
        choices = {CHOICE_KEYS[k]: v for k, v in settings.items() if k in CHOICE_KEYS}
        opts = {
            k: bool(v) if v in (0, 1) else v
            for k, v in settings.items()
            if k not in CHOICE_KEYS and k != "cudnn_sdp"
        }
        cudnn = settings.get("cudnn_sdp")
        if cudnn is not None and device.type == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(bool(cudnn))
        try:
            alt = FastTargetRunner(
                target,
                default_boundaries(L),
                max_batch_size=1,
                max_seq_len=args.max_seq_len,
                compile_options=opts,
                kernel_choices=KernelChoices(**{**KernelChoices().__dict__, **choices}),
                compile=args.compile,
            )
            res[label] = {
                "settings": settings,
                "forward_ms": verify_costs(alt, prompt, args.variant_ks, args.iters, args.repeats),
            }
            fm = res[label]["forward_ms"]
            res[label]["verify_over_decode"] = {k: v / fm["1"] for k, v in fm.items()}
            res[label]["compile_s"] = time.perf_counter() - t1
            print(f"[{name}] variant {label}: {res[label]}", flush=True)
            del alt
        except Exception as err:  # noqa: BLE001 - a failing variant is a finding, not a crash
            traceback.print_exc()
            res[label] = {"error": f"{type(err).__name__}: {err}"}
        finally:
            if cudnn is not None and device.type == "cuda":
                torch.backends.cuda.enable_cudnn_sdp(True)
    return res


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{'model':<14} {'plain tok/s':>11} {'decode ms':>9} {'floor ms':>8} {'x floor':>7} "
        f"{'v16/d1':>6} {'HF ms/tok':>9}  verify(k)/decode(1)"
    ]
    for name, r in results.items():
        if not isinstance(r, dict) or "plain_decode_tok_s" not in r:
            continue
        ratios = r.get("verify_over_decode", {})
        fm = r.get("forward_ms", {})
        lines.append(
            f"{name:<14} {r['plain_decode_tok_s']:>11.1f} {fm.get('1', math.nan):>9.3f} {r['hbm_floor_ms']:>8.3f} "
            f"{r.get('decode_ms_over_hbm_floor', math.nan):>7.2f} {ratios.get('16', math.nan):>6.2f} "
            f"{r.get('hf_generate_ms_per_token', math.nan):>9.2f}  "
            + " ".join(f"{k}:{v:.2f}" for k, v in ratios.items())
        )
    return "\n".join(lines)


def _share(value: Any, width: int) -> str:
    return f"{value:>{width}.0%}" if isinstance(value, float) else f"{'-':>{width}}"


def context_table(results: dict[str, Any]) -> str:
    """Per model and context: decode(1) and verify(k) ms, verify/decode, and the attention's share
    (profiled on CUDA, else '-') and the context's share of decode(1) and the widest verify."""
    lines: list[str] = []
    for name, r in results.items():
        by_ctx = r.get("by_context") if isinstance(r, dict) else None
        if not isinstance(by_ctx, dict) or "skipped" in by_ctx or not by_ctx:
            continue
        ks = list(next(iter(by_ctx.values()))["forward_ms"])
        wide = ks[-1]
        if not lines:
            lines.append("")
        lines.append(
            f"{'model':<14} {'context':>7} "
            + " ".join(f"{'ms k=' + k:>9}" for k in ks)
            + f" {'v' + wide + '/d1':>7} {'attn d1':>7} {'attn v' + wide:>9} {'ctx d1':>6} {'ctx v' + wide:>8}"
        )
        for c, row in by_ctx.items():
            fm, att, ctx = row["forward_ms"], row.get("attention_share", {}), row["context_share"]
            lines.append(
                f"{name:<14} {c:>7} "
                + " ".join(f"{fm[k]:>9.3f}" for k in ks)
                + f" {row['verify_over_decode'].get(wide, math.nan):>7.2f} {_share(att.get('1'), 7)} "
                f"{_share(att.get(wide), 9)} {_share(ctx.get('1'), 6)} {_share(ctx.get(wide), 8)}"
            )
    return "\n".join(lines)


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 0,1024,4096, got {text!r}"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,llama-3.1-8b")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU in float32 (checks this script)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--max-k", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--hf-tokens", type=int, default=16)
    ap.add_argument("--parity-steps", type=int, default=32)
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument("--skip-main", action="store_true", help="run only --variants")
    ap.add_argument(
        "--fp32-ref", action="store_true", help="also compare logits with a float32 copy of the model"
    )
    ap.add_argument("--compile", type=lambda s: s == "1", default=None, help="1/0 (default: on CUDA)")
    ap.add_argument("--variants", type=parse_variants, default=[], help="model/label=key:val+key:val,...")
    ap.add_argument("--variant-ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 64])
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip remaining work after this many seconds")
    ap.add_argument(
        "--context-tokens",
        type=int_list,
        default=[],
        help="also time decode(1) and verify(k) with this many tokens in the KV cache, e.g. 0,1024,4096,8064",
    )
    ap.add_argument(
        "--context-ks", type=int_list, default=[1, 16, 64, 128], help="--context-tokens: the widths k timed"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.tiny:
        device, dtype, models = torch.device("cpu"), torch.float32, ["tiny"]
        args.iters, args.repeats, args.new_tokens, args.parity_steps = 2, 3, 16, 8
        args.hf_tokens = min(args.hf_tokens, 4)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        models = args.models.split(",")
    unknown = [m for m in models if m not in SHAPES]
    if unknown:
        raise ConfigError(f"--models: unknown shape(s) {unknown}; known: {sorted(SHAPES)}")
    if args.context_tokens:
        if 1 not in args.context_ks:
            args.context_ks = [1, *args.context_ks]  # decode(1): every ratio's base
        check_contexts(models, args.context_tokens, args.context_ks)
    start = time.perf_counter()
    deadline = start + args.budget_s
    results: dict[str, Any] = {
        "meta": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "device": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or "cpu",
            "torch": torch.__version__,
            "dtype": str(dtype),
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "context_tokens": sorted(set(args.context_tokens)),
            "context_ks": sorted(set(args.context_ks)) if args.context_tokens else [],
        }
    }
    bw = copy_bandwidth(device)
    results["meta"]["copy_bandwidth_bytes_per_s"] = bw
    for name in [] if args.skip_main else models:
        if time.perf_counter() > deadline:
            results[name] = {"skipped": "time budget"}
            continue
        try:
            results[name] = bench_model(name, args, device, dtype, deadline)
        except Exception as err:  # noqa: BLE001 - a benchmark reports a failing section and goes on
            traceback.print_exc()
            results[name] = {"error": f"{type(err).__name__}: {err}"}
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name in dict.fromkeys(model for model, _, _ in args.variants):
        if (args.skip_main or name in results) and time.perf_counter() < deadline:
            results[f"variants_{name}"] = bench_variants(name, args, device, dtype, deadline)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=2) + "\n")
    results["meta"]["total_s"] = time.perf_counter() - start
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=1))
    print(table(results))
    if args.context_tokens:
        print(context_table(results))
    return 0


if __name__ == "__main__":
    run_script(main)
