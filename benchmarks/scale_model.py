"""Scale model: projected speculative speed at a large target's shape, from acceptance traces.

Our users' targets are 8B parameters and up; a 135M target's forward is launch latency. This runs a
random-weight target and draft at the Llama-3.1-8B shape (draft: one layer, hidden 4096, MLP 14,336,
Vd 32,000) through the real round loop (`SpeculativeDecoder`: launch-ahead and CUDA graphs on a
GPU), with every round accepting the tree nodes a trained draft's round accepted (`accepted_paths`
in an `eaglewire bench` bench.json; `eaglewire.engine.forced`). So each round drafts, verifies,
commits and extends exactly as much as it would with the trained draft, at the large shape, and
the time per generated token is what that draft would get there, **a projection**: random weights
change no kernel's cost, but only the trace's acceptance is real.

    python benchmarks/scale_model.py --traces bench-out/mt-bench/bench.json [more bench.json] \\
        --num-prompts 24 --out scale-out                                   # on a GPU (H200: ~16 GB + KV)
    python benchmarks/scale_model.py --tiny --out /tmp/scale               # CPU check of this script
    python benchmarks/scale_model.py --traces ... --context-tokens 4096 --out scale-4k   # at a long context

Per traced setting (each method with a draft in each bench.json): every prompt replayed (random
prompt ids of the recorded length, the recorded rounds, stopped at the recorded new tokens, eos
off), timed after a warm-up (CUDA events; CPU: perf_counter), and plain decoding
(`engine.plain`) of the same token counts on the same runner. Then the round's parts at the shape:
a draft step (a chain's and each traced tree's: draft round ms / its draft forwards), an extend of
3 rows, verify(N) and decode(1) at a 128-token context, the measured device-to-device copy
bandwidth, the draft step's weight bytes and `draft_step_over_floor` = step ms / (weight bytes /
bandwidth). Writes `scale.json` (keys named in `summary_keys`) and prints a Markdown table last.

The draft's head is drawn with logits of standard deviation `--head-logit-std` (a trained draft is
confident; a default-initialised random head is nearly uniform over Vd, and EAGLE-2 reranking then
keeps shallow trees only, which could not accept the recorded depths). `replayed_exactly` /
`rounds_same_length` say how faithfully the rounds followed the trace (see `engine.forced`).

`--context-tokens N`: every replayed prompt is N random tokens (not its recorded length), so the
recorded rounds run with N tokens already in the target's and the draft's caches (their positions
start at N), and the parts are timed after an N-token context instead of 128. Round ms, plain
decode ms (`plain_decode_ms`: per token, prefill left out) and the projected speed-ups are then at
that context (`projected_decode_speedup` leaves both prefills out: an N-token prefill is a real
share of a 256-token answer). N + the longest replayed answer + the widest verify must fit the
shape's positions (exit 2 otherwise).

Draft against verify (issue 54: the draft's own attention over a long context must not make a
round slower than its verify): per timed draft setting, its draft round's ms against verify(N
nodes) at the parts' context, a PASS/FAIL line each, `draft_vs_verify` in scale.json and
`draft_round_not_slower_than_verify` (all of them pass).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a file: make the sibling benchmark modules importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_speed import (
    SHAPES,
    build_target,
    context_forward_ms,
    fill_context,
    kernel_profile_filled,
    time_ms,
)

from eaglewire.bench.report import describe_device, now_iso
from eaglewire.bench.timing import Stopwatch
from eaglewire.cli.common import run_script
from eaglewire.contract.numbering import default_boundaries
from eaglewire.draft.config import draft_config_for_target
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.forced import ForcedAcceptance
from eaglewire.engine.plain import generate_plain_with_stats
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json
from eaglewire.target.loading import LoadedTarget

DRAFT_VOCAB = {"llama-3.1-8b": 32000, "smollm2-135m": 32000, "tiny": 256}
KEY_SUFFIX = {"llama-3.1-8b": "8b", "smollm2-135m": "135m", "tiny": "tiny"}  # scale.json key names
CONTEXT = 128  # prompt tokens the parts are timed at
EXTEND_ROWS = 3  # an extend of an accepted path (2 drafts + the bonus)
VERIFY_WIDTHS = (1, 16, 64, 128)
TINY_TREE = SpecArgs(num_steps=4, topk=3, num_draft_tokens=8)


@dataclass(frozen=True)
class PromptTrace:
    prompt_tokens: int
    new_tokens: int
    accepted_paths: list[list[int]]  # per round: tree nodes accepted, root first


@dataclass(frozen=True)
class TraceSet:
    """One traced setting: a method with a draft in one bench.json, its first prompts."""

    source: str  # the bench.json it came from
    method: str
    spec: SpecArgs
    tau_recorded: float | None  # the method's tau over all its prompts (the trained draft's)
    prompts: list[PromptTrace]

    @property
    def label(self) -> str:
        s = self.spec
        kind = "chain" if s.is_chain else "tree"
        return f"{kind} {s.num_steps}x{s.topk}x{s.num_draft_tokens}"

    @property
    def tau_replayed(self) -> float:
        """Tokens per round over the replayed prompts' recorded rounds (bonus included)."""
        rounds = [len(p) for t in self.prompts for p in t.accepted_paths]
        return sum(rounds) / max(len(rounds), 1)


def read_traces(paths: Sequence[Path], num_prompts: int | None) -> list[TraceSet]:
    """Every method with recorded accepted paths in each bench.json -> a TraceSet of its first
    `num_prompts` prompts (None: all)."""
    sets = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"--traces {path}: cannot read it as JSON ({err})") from None
        for name, method in data.get("methods", {}).items():
            settings = method.get("settings") or {}
            prompts = method.get("prompts") or []
            if not all(k in settings for k in ("num_steps", "topk", "num_draft_tokens")):
                continue  # not speculative (plain, transformers' methods)
            if not any(p.get("accepted_paths") for p in prompts):
                raise ConfigError(
                    f"{path}: methods[{name!r}].prompts[*].accepted_paths: expected each round's accepted "
                    "tree nodes, found none",
                    fix="rerun `eaglewire bench` with this version (it records accepted_paths)",
                )
            spec = SpecArgs(
                num_steps=int(settings["num_steps"]),
                topk=int(settings["topk"]),
                num_draft_tokens=int(settings["num_draft_tokens"]),
            )
            chosen = prompts if num_prompts is None else prompts[:num_prompts]
            traces = [
                PromptTrace(
                    prompt_tokens=int(p["prompt_tokens"]),
                    new_tokens=int(p["new_tokens"]),
                    accepted_paths=[[int(n) for n in path_] for path_ in p["accepted_paths"]],
                )
                for p in chosen
            ]
            tau = method.get("tau")
            sets.append(TraceSet(str(path), name, spec, None if tau is None else float(tau), traces))
    if not sets:
        raise ConfigError(
            f"--traces {[str(p) for p in paths]}: no method with a draft (eagle-chain, eagle-tree) found",
            fix="pass bench.json files of `eaglewire bench --draft ...` runs",
        )
    return sets


def synthetic_bench(path: Path, *, num_prompts: int = 2, seed: int = 0) -> Path:
    """A bench.json-shaped trace file for --tiny: a chain of 5 and a small tree, random accepted
    depths (plumbing only: the paths are node prefixes, not a trained draft's)."""
    rng = random.Random(seed)
    methods = {}
    for name, spec in (("eagle-chain", SpecArgs.chain(5)), ("eagle-tree", TINY_TREE)):
        prompts = []
        for _ in range(num_prompts):
            prompt_tokens, new_tokens = rng.randint(8, 24), rng.randint(12, 24)
            paths, emitted = [], 0
            while emitted < new_tokens:
                depth = rng.randint(0, spec.num_steps)
                paths.append(list(range(depth + 1)))
                emitted += depth + 1
            prompts.append(
                {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "accepted_paths": paths}
            )
        settings = {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens}
        rounds = [len(p) for pr in prompts for p in pr["accepted_paths"]]
        methods[name] = {"settings": settings, "tau": sum(rounds) / len(rounds), "prompts": prompts}
    atomic_write_json(path, {"prompts": "synthetic (scale_model --tiny)", "methods": methods})
    return path


def scale_draft(target: LoadedTarget, draft_vocab: int, head_logit_std: float) -> Eagle3Draft:
    """A random draft of the target's shape (one layer, the target's MLP width), Vd = draft_vocab,
    its head drawn so logits have std `head_logit_std` (0: a zero head, all logits equal)."""
    cfg = draft_config_for_target(target.config, num_aux=3, draft_vocab_size=draft_vocab)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        # the head reads norm(h), of unit RMS: logit std = weight std * sqrt(H)
        draft.lm_head.weight.normal_(0.0, head_logit_std / math.sqrt(cfg.hidden_size))
    draft.get_buffer("draft_to_target").copy_(torch.arange(draft_vocab))
    return draft.to(device=target.device, dtype=target.dtype).eval()


def draft_step_weight_bytes(draft: Eagle3Draft) -> int:
    """Bytes of the weights one draft step reads: the layer (q/k/v from the 2H-wide input, o, the
    MLP, norms), the final norm and the head; not fc (extend only) nor the embedding (a gather)."""
    parts = [draft.layer, draft.norm, draft.lm_head]
    return sum(p.numel() * p.element_size() for m in parts for p in m.parameters())


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy (read + write), the memory floor's bandwidth."""
    numel = (256 if device.type == "cuda" else 4) * 1024 * 1024  # 1 GiB / 16 MiB of float32
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, iters=5, repeats=5)
    return 2 * numel * 4 / (ms / 1000)


def random_prompt(length: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=gen).tolist()


def replay(
    ts: TraceSet,
    decoder: SpeculativeDecoder,
    forced: ForcedAcceptance,
    watch: Stopwatch,
    plain_seconds: Callable[[list[int], int], tuple[float, float]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every prompt of `ts` through the speculative loop with forced acceptance, and plain decoding
    of the same counts; projected tok/s and speed-up (prefill included in both, as `eaglewire bench`,
    and left out of both: `projected_decode_speedup`). With --context-tokens every prompt has that
    many tokens instead of its recorded length."""
    runner = decoder.runner
    spec_s = plain_s = prefill_s = plain_prefill_s = 0.0
    tokens = rounds = exact = same_length = recorded_rounds = prompt_tokens = 0
    for i, trace in enumerate(ts.prompts):
        length = args.context_tokens or trace.prompt_tokens
        ids = random_prompt(length, runner.vocab_size, seed=i)
        prompt_tokens += length
        forced.load(len(ids) - 1, trace.accepted_paths)
        timed = watch.measure(
            lambda ids=ids, n=trace.new_tokens: decoder.generate(ids, max_new_tokens=n),  # type: ignore[misc]
            warmup=args.warmup,
            repeats=args.repeats,
        )
        result = timed.value
        spec_s += timed.seconds
        prefill_s += result.phase_times.get("prefill", 0.0)
        tokens += len(result.token_ids)
        rounds += result.num_verifications
        recorded = trace.accepted_paths[: result.num_verifications]
        recorded_rounds += len(trace.accepted_paths)
        exact += sum(a == b for a, b in zip(result.accepted_paths, recorded, strict=False))
        same_length += sum(len(a) == len(b) for a, b in zip(result.accepted_paths, recorded, strict=False))
        total, prefill = plain_seconds(ids, len(result.token_ids))
        plain_s, plain_prefill_s = plain_s + total, plain_prefill_s + prefill
    round_ms = (spec_s - prefill_s) / max(rounds, 1) * 1000
    plain_decode_ms = (plain_s - plain_prefill_s) / max(tokens, 1) * 1000
    return {
        "source": ts.source,
        "method": ts.method,
        "setting": ts.label,
        "settings": {
            "num_steps": ts.spec.num_steps,
            "topk": ts.spec.topk,
            "num_draft_tokens": ts.spec.num_draft_tokens,
        },
        "tau_recorded": ts.tau_recorded,
        "tau_replayed_prompts": ts.tau_replayed,
        "num_prompts": len(ts.prompts),
        "prompt_tokens_mean": prompt_tokens / max(len(ts.prompts), 1),
        "new_tokens": tokens,
        "rounds": rounds,
        "rounds_recorded": recorded_rounds,
        "replayed_exactly": exact / max(rounds, 1),  # rounds that accepted the recorded nodes
        "rounds_same_length": same_length / max(rounds, 1),  # rounds that emitted the recorded count
        "tau_replayed": tokens / max(rounds, 1),
        "seconds": spec_s,
        "round_ms": round_ms,
        "prefill_seconds": prefill_s,
        "projected_tok_s": tokens / spec_s,
        "plain_seconds": plain_s,
        "plain_prefill_seconds": plain_prefill_s,
        "plain_tok_s": tokens / plain_s,
        "plain_decode_ms": plain_decode_ms,
        "projected_speedup": plain_s / spec_s,
        # decoding alone (both prefills left out): a round's tokens against plain's ms per token
        "projected_decode_speedup": tokens / max(rounds, 1) * plain_decode_ms / max(round_ms, 1e-9),
        # the trace's tau over all its prompts at the measured round cost (rounds cost the same
        # whatever they accept): the speed-up at the acceptance the trained draft measured
        "projected_speedup_at_trace_tau": None
        if ts.tau_recorded is None
        else ts.tau_recorded / ((spec_s - prefill_s) / max(rounds, 1)) * (plain_s / max(tokens, 1)),
    }


def draft_parts(
    drafter_for: Callable[[SpecArgs], Drafter],
    target: LoadedTarget,
    specs: Sequence[SpecArgs],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """ms of one draft round per setting (and per draft forward in it) and of an extend of
    EXTEND_ROWS rows, after a prefix of `args.parts_context` rows (aux states random: values do not
    change cost)."""
    dev = target.device
    context = int(args.parts_context)
    width = drafter_for(specs[0]).draft.config.aux_width
    gen = torch.Generator().manual_seed(1)
    aux = torch.randn(context, width, generator=gen).to(dev, target.dtype)
    tokens = torch.randint(3, target.vocab_size, (context,), generator=gen).to(dev)
    out: dict[str, Any] = {}
    n = EXTEND_ROWS
    for spec in specs:
        drafter = drafter_for(spec)
        drafter.reset()
        drafter.extend(aux[:-n], tokens[:-n], start_position=0)
        root, position = int(tokens[-n]), context - n
        round_ms = time_ms(
            lambda d=drafter, r=root, p=position: d.draft_tree(r, p, SamplingParams()),
            dev,
            args.iters,
            args.reps,
        )
        forwards = max(spec.num_steps - 1, 1)  # the first step's logits come from the extend

        def extend(d: Drafter = drafter) -> None:
            d.committed = context - n  # re-commit the same rows: the same window every call
            d.extend(aux[-n:], tokens[-n:], start_position=context - n)

        kind = "chain" if spec.is_chain else "tree"
        out[f"{kind} {spec.num_steps}x{spec.topk}x{spec.num_draft_tokens}"] = {
            "round_ms": round_ms,
            "draft_forwards": forwards,
            "step_ms": round_ms / forwards,
            f"extend_{n}_ms": time_ms(extend, dev, args.iters, args.reps),
        }
        print(f"[parts] {spec}: round {round_ms:.3f} ms", flush=True)
    return out


def components(
    runner: FastTargetRunner,
    drafter_for: Callable[[SpecArgs], Drafter],
    target: LoadedTarget,
    sets: Sequence[TraceSet],
    args: argparse.Namespace,
) -> dict[str, Any]:
    dev = target.device
    bandwidth = copy_bandwidth(dev)
    weight_bytes = draft_step_weight_bytes(drafter_for(SpecArgs.chain(5)).draft)
    floor_ms = weight_bytes / bandwidth * 1000
    chain = SpecArgs.chain(5)
    traced = {ts.spec for ts in sets if not ts.spec.is_chain}
    trees = sorted(traced | set(args.extra_trees), key=lambda s: (s.num_draft_tokens, s.num_steps, s.topk))
    specs = [chain, *trees]
    out: dict[str, Any] = {
        "copy_bandwidth_bytes_per_s": bandwidth,
        "draft_step_weight_bytes": weight_bytes,
        "draft_step_floor_ms": floor_ms,
    }
    drafts = {"draft": drafter_for}
    if args.weights_before_after:  # the same draft's weights, concatenated inside every forward
        drafts["draft_unfused"] = unfused_drafters(drafter_for(chain).draft)
    for key, make in drafts.items():
        out[key] = draft_parts(make, target, specs, args)
        for row in out[key].values():
            row["step_over_floor"] = row["step_ms"] / floor_ms
    context = int(args.parts_context)
    widths = sorted({*VERIFY_WIDTHS, *(s.num_draft_tokens for s in specs)})
    forward_ms = context_forward_ms(runner, context, widths, args.iters, args.reps)
    out["context_tokens"] = context  # the parts' context: prefix rows before each timed part
    out["forward_ms"] = forward_ms  # verify(N) (chain mask) at that context; "1": decode(1)
    out["verify_over_decode"] = {k: v / forward_ms["1"] for k, v in forward_ms.items()}
    if args.profile and dev.type == "cuda":  # kernels by category: where verify(128) spends its time
        kernels = {}
        for k in (1, 128):
            fill_context(runner, context)
            kernels[str(k)] = kernel_profile_filled(runner, context, k)
        out["kernels"] = kernels
    return out


def draft_vs_verify(parts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per timed draft setting: its draft round's ms against verify(its nodes) at the parts' context,
    and whether the round's drafting is not slower than its verify (issue 54's condition)."""
    out = {}
    for name, row in parts["draft"].items():
        nodes = int(name.split()[1].split("x")[2])
        verify = parts["forward_ms"].get(str(nodes))
        if verify is None:
            continue
        out[name] = {
            "context_tokens": parts["context_tokens"],
            "draft_round_ms": row["round_ms"],
            "verify_ms": verify,
            "verify_nodes": nodes,
            "draft_over_verify": row["round_ms"] / verify,
            "draft_not_slower": bool(row["round_ms"] <= verify),
        }
    return out


def draft_vs_verify_lines(checks: dict[str, dict[str, Any]]) -> list[str]:
    """One PASS/FAIL line per setting of `draft_vs_verify`."""
    return [
        f"draft vs verify at {c['context_tokens']} context tokens, {name}: draft round {c['draft_round_ms']:.3f} ms "
        f"{'<=' if c['draft_not_slower'] else '>'} verify({c['verify_nodes']}) {c['verify_ms']:.3f} ms "
        f"({c['draft_over_verify']:.2f}x): {'PASS' if c['draft_not_slower'] else 'FAIL'}"
        for name, c in checks.items()
    ]


def unfused_drafters(draft: Eagle3Draft) -> Callable[[SpecArgs], Drafter]:
    """Drafters of a copy of `draft` that keeps concatenating q/k/v and gate/up inside each forward
    (the engine before `Eagle3Draft.fuse_weights`): the before half of --weights-before-after."""
    copy = type(draft)(draft.config).to(device=draft.get_buffer("draft_to_target").device)
    copy.load_state_dict(draft.state_dict())
    copy = copy.to(dtype=next(draft.parameters()).dtype).eval()
    copy.fuse_weights = lambda: None  # type: ignore[method-assign]
    drafters: dict[SpecArgs, Drafter] = {}

    def make(spec: SpecArgs) -> Drafter:
        if spec not in drafters:
            drafters[spec] = Drafter(copy, spec)
        return drafters[spec]

    return make


def summary_keys(shape: str, rows: list[dict[str, Any]], parts: dict[str, Any]) -> dict[str, Any]:
    """The checkable headline keys: projected speed-ups (best tree; chain of 5, else the best chain;
    with and without prefill), the draft step's ratio to its floor (chain, and the best tree's),
    verify(128)/decode(1), and whether every draft round is not slower than its verify."""
    s = KEY_SUFFIX.get(shape, shape.replace("-", "_").replace(".", "_"))
    trees = [r for r in rows if r["settings"]["topk"] > 1]
    chains = [r for r in rows if r["settings"]["topk"] == 1]
    best_tree = max(trees, key=lambda r: r["projected_speedup"], default=None)
    chain5 = [r for r in chains if r["settings"]["num_steps"] == 5]
    chain = max(chain5 or chains, key=lambda r: r["projected_speedup"], default=None)
    draft = parts["draft"]
    out: dict[str, Any] = {
        f"projected_{s}_speedup_tree": None if best_tree is None else best_tree["projected_speedup"],
        f"projected_{s}_speedup_tree_setting": None if best_tree is None else best_tree["setting"],
        f"projected_{s}_speedup_chain": None if chain is None else chain["projected_speedup"],
        f"projected_{s}_speedup_chain_setting": None if chain is None else chain["setting"],
        f"projected_{s}_speedup_tree_at_trace_tau": None
        if best_tree is None
        else best_tree["projected_speedup_at_trace_tau"],
        f"projected_{s}_speedup_chain_at_trace_tau": None
        if chain is None
        else chain["projected_speedup_at_trace_tau"],
        f"projected_{s}_decode_speedup_tree": None
        if best_tree is None
        else best_tree["projected_decode_speedup"],
        f"projected_{s}_decode_speedup_chain": None if chain is None else chain["projected_decode_speedup"],
        f"draft_step_over_floor_{s}": draft["chain 5x1x6"]["step_over_floor"],
        f"verify128_over_decode1_{s}": parts["verify_over_decode"].get("128"),
        # issue 54: no timed draft round slower than its verify at the parts' context
        f"draft_round_not_slower_than_verify_{s}": all(
            c["draft_not_slower"] for c in draft_vs_verify(parts).values()
        ),
    }
    if best_tree is not None and best_tree["setting"] in draft:
        out[f"draft_tree_step_over_floor_{s}"] = draft[best_tree["setting"]]["step_over_floor"]
    return out


def markdown(result: dict[str, Any]) -> str:
    meta, parts = result["meta"], result["components"]
    lines = [
        f"**Projection** ({meta['shape']}, random weights, {meta['device']}, {meta['dtype']}): rounds "
        "replay a trained draft's accepted paths; only the acceptance is measured on a real draft. "
        + (
            "Prompts of their recorded lengths."
            if meta.get("context_tokens") is None
            else f"Every prompt {meta['context_tokens']} tokens (--context-tokens): the rounds run at that context."
        ),
        "",
        "| setting | trace (file, method) | prompt tokens | tau trained | tau replayed | same-length rounds "
        "| round ms | plain decode ms | projected tok/s | plain tok/s | projected speed-up | decode only "
        "| at the trained tau |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["settings"]:
        tau = "-" if r["tau_recorded"] is None else f"{r['tau_recorded']:.2f}"
        at = r["projected_speedup_at_trace_tau"]
        at_tau = "-" if at is None else f"{at:.2f}x"
        lines.append(
            f"| {r['setting']} | {Path(r['source']).parent.name}/{Path(r['source']).name}, {r['method']} "
            f"| {r['prompt_tokens_mean']:.0f} | {tau} | {r['tau_replayed']:.2f} | {r['rounds_same_length']:.0%} "
            f"| {r['round_ms']:.2f} | {r['plain_decode_ms']:.2f} | {r['projected_tok_s']:.1f} "
            f"| {r['plain_tok_s']:.1f} | {r['projected_speedup']:.2f}x | {r['projected_decode_speedup']:.2f}x "
            f"| {at_tau} |"
        )
    fm = parts["forward_ms"]
    lines += [
        "",
        f"Parts at a {parts['context_tokens']}-token context: decode(1) {fm['1']:.3f} ms; verify(128)/decode(1) {parts['verify_over_decode']['128']:.2f}; "
        f"copy bandwidth {parts['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s; draft step weights "
        f"{parts['draft_step_weight_bytes'] / 1e6:.0f} MB (floor {parts['draft_step_floor_ms']:.3f} ms)",
        "",
        "| draft setting | round ms | forwards | step ms | step / floor | extend(3) ms |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (("draft", ""), ("draft_unfused", " (weights concatenated per forward)")):
        for name, row in parts.get(key, {}).items():
            lines.append(
                f"| {name}{label} | {row['round_ms']:.3f} | {row['draft_forwards']} | {row['step_ms']:.3f} "
                f"| {row['step_over_floor']:.2f} | {row[f'extend_{EXTEND_ROWS}_ms']:.3f} |"
            )
    lines += [
        "",
        f"Draft round against its verify at {parts['context_tokens']} context tokens (issue 54: the draft's "
        "attention over a long context must not make a round slower than its verify):",
        "",
        "| setting | draft round ms | verify(N) ms | draft / verify | not slower |",
        "|---|---|---|---|---|",
    ]
    for name, c in result["draft_vs_verify"].items():
        lines.append(
            f"| {name} | {c['draft_round_ms']:.3f} | {c['verify_ms']:.3f} | {c['draft_over_verify']:.2f} "
            f"| {'PASS' if c['draft_not_slower'] else 'FAIL'} |"
        )
    lines += [
        "",
        "Round parts per setting (verify(N) + draft round + extend, launch gaps not included) and the "
        "tau each would need for the goal (2.0x chains, 2.5x trees):",
        "",
        "| setting | verify(N) ms | draft round ms | extend ms | parts ms | tau for the goal |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in round_parts(parts).items():
        lines.append(
            f"| {name} | {row['verify_ms']:.3f} | {row['draft_round_ms']:.3f} | {row['extend_ms']:.3f} "
            f"| {row['parts_ms']:.3f} | {row['tau_for_goal']:.2f} |"
        )
    return "\n".join(lines)


def round_parts(parts: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per timed draft setting: the sum of its round's parts and the tau at which rounds of that
    cost would reach the goal speed-up over decode(1) (2.0x for chains, 2.5x for trees)."""
    out = {}
    decode = parts["forward_ms"]["1"]
    for name, row in parts["draft"].items():
        nodes = int(name.split()[1].split("x")[2])
        verify = parts["forward_ms"].get(str(nodes))
        if verify is None:
            continue
        total = verify + row["round_ms"] + row[f"extend_{EXTEND_ROWS}_ms"]
        goal = 2.0 if name.startswith("chain") else 2.5
        out[name] = {
            "verify_ms": verify,
            "draft_round_ms": row["round_ms"],
            "extend_ms": row[f"extend_{EXTEND_ROWS}_ms"],
            "parts_ms": total,
            "tau_for_goal": goal * total / decode,
        }
    return out


def parse_tree(text: str) -> SpecArgs:
    steps, topk, nodes = (int(x) for x in text.lower().split("x"))
    return SpecArgs(num_steps=steps, topk=topk, num_draft_tokens=nodes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, nargs="+", default=[], help="bench.json files (one per setting)")
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--num-prompts", type=int, default=24, help="first N prompts of each trace")
    ap.add_argument("--out", type=Path, required=True, help="directory for scale.json")
    ap.add_argument("--tiny", action="store_true", help="tiny shape on CPU, float32, a synthetic trace")
    ap.add_argument("--head-logit-std", type=float, default=20.0, help="the random draft head's logit std")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each prompt first")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs of each prompt (median)")
    ap.add_argument("--iters", type=int, default=20, help="back-to-back calls per timed part")
    ap.add_argument("--reps", type=int, default=5, help="repeats of those (median)")
    ap.add_argument(
        "--extra-trees",
        type=lambda text: [parse_tree(t) for t in text.split(",") if t],
        default=[],
        help="more tree settings (STEPSxTOPKxNODES,...) whose round parts to time without a trace",
    )
    ap.add_argument(
        "--weights-before-after",
        action="store_true",
        help="also time the draft parts with q/k/v and gate/up concatenated in every forward",
    )
    ap.add_argument("--profile", action="store_true", help="kernels by category of decode(1) and verify(128)")
    ap.add_argument(
        "--context-tokens",
        type=int,
        default=None,
        help="every replayed prompt this many tokens (the rounds run at that context) and the parts timed "
        "after it (default: the recorded prompt lengths, parts at 128)",
    )
    args = ap.parse_args(argv)
    if args.num_prompts < 1:
        raise ConfigError(f"--num-prompts: expected >= 1, got {args.num_prompts}")
    if args.context_tokens is not None and args.context_tokens < 1:
        raise ConfigError(
            f"--context-tokens: expected >= 1 prompt tokens, got {args.context_tokens}",
            fix="leave it out for the recorded prompt lengths",
        )
    args.parts_context = args.context_tokens or CONTEXT
    return args


def check_positions(
    shape: str, context_tokens: int | None, longest: int, new_tokens: int, widest: int
) -> None:
    """With --context-tokens: that context + the longest replayed answer + the widest verify within the
    shape's positions; a ConfigError naming the flag and the lengths otherwise (before any model)."""
    positions = int(SHAPES[shape]["max_position_embeddings"])
    if context_tokens is not None and longest > positions:
        raise ConfigError(
            f"--context-tokens {context_tokens}: {context_tokens} context tokens + {new_tokens} replayed new "
            f"tokens (the longest trace) + a verify of {widest} + 1 = {longest} positions; the {shape} shape "
            f"has {positions} (max_position_embeddings)",
            fix=f"use --context-tokens <= {positions - new_tokens - widest - 1}, or fewer replayed tokens",
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    if args.tiny:
        device, dtype, args.shape = torch.device("cpu"), torch.float32, "tiny"
        # tiny matmuls: a second thread only adds synchronisation (10-100x slower on a busy machine)
        torch.set_num_threads(1)
        args.iters, args.reps, args.warmup = 2, 1, 0
        if not args.traces:
            args.out.mkdir(parents=True, exist_ok=True)
            args.traces = [synthetic_bench(args.out / "tiny_bench.json")]
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if not args.traces:
            raise ConfigError(
                "--traces: expected at least one bench.json", fix="pass --traces FILE ... or --tiny"
            )
    sets = read_traces(args.traces, args.num_prompts)
    widths = {ts.spec.num_draft_tokens for ts in sets} | {t.num_draft_tokens for t in args.extra_trees}
    nodes = max(widths)
    if args.context_tokens is None:
        longest = max(p.prompt_tokens + p.new_tokens for ts in sets for p in ts.prompts)
        max_seq_len = max(longest, 2 * CONTEXT) + max(nodes, 128) + 1
    else:  # the target's and the draft's caches (the drafter's is sized from the runner's)
        new_tokens = max(p.new_tokens for ts in sets for p in ts.prompts)
        max_seq_len = args.context_tokens + new_tokens + max(nodes, 128) + 1
        check_positions(args.shape, args.context_tokens, max_seq_len, new_tokens, max(nodes, 128))
    target = build_target(args.shape, device, dtype)
    runner = FastTargetRunner(
        target, default_boundaries(target.num_layers), max_batch_size=1, max_seq_len=max_seq_len
    )
    for width in sorted(widths):
        runner.reserve_verify_width(width)
    forced = ForcedAcceptance(runner.max_seq_len, device)
    runner.forced_acceptance = forced
    draft = scale_draft(target, DRAFT_VOCAB[args.shape], args.head_logit_std)
    watch = Stopwatch(device)
    plain_cache: dict[tuple[int, int], tuple[float, float]] = {}

    def plain_seconds(ids: list[int], new_tokens: int) -> tuple[float, float]:
        """(seconds, of which prefill) of plain decoding `new_tokens` after `ids`."""
        key = (len(ids), new_tokens)
        if key not in plain_cache:
            timed = watch.measure(
                lambda: generate_plain_with_stats(runner, [ids], new_tokens, eos_token_ids=()),
                warmup=args.warmup,
                repeats=args.repeats,
            )
            plain_cache[key] = (timed.seconds, min(timed.value.prefill_seconds, timed.seconds))
        return plain_cache[key]

    # one decoder (and drafter: a torch.compile and graph captures each) per setting, reused
    decoders: dict[SpecArgs, SpeculativeDecoder] = {}

    def decoder_for(spec: SpecArgs) -> SpeculativeDecoder:
        if spec not in decoders:  # no eos: every prompt runs its recorded tokens
            decoders[spec] = SpeculativeDecoder(runner, draft, spec)
        return decoders[spec]

    def drafter_for(spec: SpecArgs) -> Drafter:
        drafter = decoder_for(spec).drafter
        assert drafter is not None
        return drafter

    rows = []
    for ts in sets:
        rows.append(replay(ts, decoder_for(ts.spec), forced, watch, plain_seconds, args))
        print(f"[{ts.label}] {json.dumps(rows[-1])}", flush=True)
    runner.forced_acceptance = None
    parts = components(runner, drafter_for, target, sets, args)
    result = {
        "meta": {
            "what": "projection: random weights at the shape, rounds replaying a trained draft's accepted paths",
            "shape": args.shape,
            "target_shape": SHAPES[args.shape],
            "draft": {
                "hidden_size": draft.config.hidden_size,
                "intermediate_size": draft.config.intermediate_size,
                "draft_vocab_size": draft.config.draft_vocab_size,
                "layers": 1,
                "head_logit_std": args.head_logit_std,
            },  # fmt: skip
            "device": describe_device(device),
            "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "date": now_iso(),
            "command": " ".join(sys.argv),
            "traces": [str(p) for p in args.traces],
            "num_prompts": args.num_prompts,
            "context_tokens": args.context_tokens,  # None: the recorded prompt lengths
            "parts_context_tokens": parts["context_tokens"],
            "max_seq_len": max_seq_len,
        },
        **summary_keys(args.shape, rows, parts),
        "draft_vs_verify": draft_vs_verify(parts),
        "trace_tau": {f"{ts.method} {ts.label} ({ts.source})": ts.tau_recorded for ts in sets},
        "settings": rows,
        "components": parts,
        "round_parts": round_parts(parts),
    }
    result["meta"]["seconds"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "scale.json", result)
    for line in draft_vs_verify_lines(result["draft_vs_verify"]):
        print(line)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    run_script(main)
