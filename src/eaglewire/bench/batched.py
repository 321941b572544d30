"""`eaglewire bench --batch-sizes 1,2,4,...`: every method at every batch size, through the engine
that serves them (`engine.batch`: continuous batching, ragged acceptance), and the speed-up per
batch size predicted from the round costs (`predict.by_batch`).

Per batch size B and method, the prompt set (cycled to at least 2B requests, so the batch stays
full for a while) is submitted at once to a `BatchEngine` of B rows; the run ends when the last
request does. Reported: total generated tokens per second, per-request latency (submit -> last
token: queueing included, as a client sees it), tau, the median wall time of a round at bucket
B (the cost table), and where the run's time went (rounds, prefills, the rest). The whole workload
runs once untimed first, so that every bucket, prompt length and compiled variant the timed run
meets has been met: a warm-up of fewer requests left later buckets' first captures in the timed
run. Plain decoding runs through the same loop without a draft (what `serve` does where the
rule says plain), so every method pays the same host bookkeeping per round.

predicted speed-up(B) = tau * plain round(B) / round(B), tau taken from the smallest batch size
run (acceptance does not depend on B: rows never see each other).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eaglewire.bench.prompts import PromptSet, encode_prompt, prompt_set_kind
from eaglewire.bench.report import describe_device, now_iso
from eaglewire.engine.batch.buckets import bucket_for
from eaglewire.engine.batch.drafter import BatchDrafter
from eaglewire.engine.batch.engine import BatchEngine, BatchRequest, Policy, RoundStats, setting_label
from eaglewire.engine.fits import ContextFit, model_positions
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.verify import StopRule
from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json, atomic_write_text
from eaglewire.predict.by_batch import PLAIN, BatchRule
from eaglewire.target.loading import LoadedTarget, dtype_name

log = logging.getLogger(__name__)

BATCH_METHODS = ("plain", "eagle-chain", "eagle-tree")


@dataclass(frozen=True)
class BatchBenchConfig:
    batch_sizes: tuple[int, ...]
    methods: tuple[str, ...]
    chain: SpecArgs
    tree: SpecArgs
    max_new_tokens: int
    warmup: bool = True
    chat: bool = True

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in BATCH_METHODS]
        if bad or not self.methods:
            raise ConfigError(
                f"--methods with --batch-sizes: expected some of {', '.join(BATCH_METHODS)}, got {list(self.methods)}"
            )
        if any(b < 1 for b in self.batch_sizes) or not self.batch_sizes:
            raise ConfigError(f"--batch-sizes: expected positive integers, got {list(self.batch_sizes)}")

    def spec(self, method: str) -> SpecArgs | None:
        return {"plain": None, "eagle-chain": self.chain, "eagle-tree": self.tree}[method]


@dataclass
class BatchRun:
    method: str
    batch: int
    requests: int
    tokens: int
    seconds: float
    latencies: list[float]
    tau: float
    round_seconds: float | None  # median wall seconds of a round at bucket `batch`
    matches_plain: int | None = None  # requests whose tokens equal plain's at this batch size
    rounds: int = 0  # rounds of every bucket the run passed through
    rounds_seconds: float = 0.0  # their wall seconds, summed
    prefill_seconds: float = 0.0  # admissions: prefills of the target and the draft
    slow_rounds: int = 0  # rounds at bucket `batch` over 3x its median (recompiles, captures, stalls)

    @property
    def other_seconds(self) -> float:
        """What neither rounds nor prefills account for: submitting, resizing buckets, the loop."""
        return max(self.seconds - self.rounds_seconds - self.prefill_seconds, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "method": self.method,
            "batch": self.batch,
            "requests": self.requests,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "latency_mean_s": statistics.fmean(lat) if lat else None,
            "latency_p50_s": lat[len(lat) // 2] if lat else None,
            "latency_p90_s": lat[min(len(lat) - 1, int(0.9 * len(lat)))] if lat else None,
            "tau": self.tau,
            "round_seconds": self.round_seconds,
            "matches_plain": self.matches_plain,
            "rounds": self.rounds,
            "rounds_seconds": self.rounds_seconds,
            "prefill_seconds": self.prefill_seconds,
            "other_seconds": self.other_seconds,
            "slow_rounds": self.slow_rounds,
        }


@dataclass
class BatchBenchReport:
    prompts: str
    prompt_kind: str
    device: str
    dtype: str
    config: BatchBenchConfig
    runs: list[BatchRun] = field(default_factory=list)
    command: str = ""
    date: str = field(default_factory=now_iso)

    def run(self, method: str, batch: int) -> BatchRun | None:
        return next((r for r in self.runs if r.method == method and r.batch == batch), None)

    def speedups(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for r in self.runs:
            plain = self.run("plain", r.batch)
            if r.method != "plain" and plain is not None and plain.tokens_per_s > 0:
                out.setdefault(r.method, {})[r.batch] = r.tokens_per_s / plain.tokens_per_s
        return out

    def greedy_differences(self) -> list[str]:
        """'eagle-chain at batch 4: 2 of 40 requests' for each run whose tokens differ from plain's at
        the same batch size (a bug in float32; near-ties may flip in bf16)."""
        return [
            f"{r.method} at batch {r.batch}: {r.requests - r.matches_plain} of {r.requests} requests"
            for r in self.runs
            if r.matches_plain is not None and r.matches_plain < r.requests
        ]

    def rule(self) -> BatchRule | None:
        """The cost table of this run as a `BatchRule` (None without plain rounds to compare with)."""
        costs: dict[str, dict[int, float]] = {}
        taus: dict[str, float] = {}
        for r in sorted(self.runs, key=lambda r: r.batch):
            if r.round_seconds is None:
                continue
            spec = self.config.spec(r.method)
            label = setting_label(spec)
            costs.setdefault(label, {})[r.batch] = r.round_seconds
            if spec is not None:
                taus.setdefault(label, r.tau)  # the smallest batch size's
        if PLAIN not in costs:
            return None
        return BatchRule(
            device=self.device,
            dtype=self.dtype,
            taus=taus,
            round_seconds=costs,
            tau_source=f"measured at batch {min(self.config.batch_sizes)} on {self.prompts}",
            measured_at=self.date,
            command=self.command,
        )

    def to_json(self) -> dict[str, Any]:
        rule = self.rule()
        return {
            "prompts": self.prompts,
            "prompt_kind": self.prompt_kind,
            "device": self.device,
            "dtype": self.dtype,
            "date": self.date,
            "command": self.command,
            "max_new_tokens": self.config.max_new_tokens,
            "settings": {m: setting_label(self.config.spec(m)) for m in self.config.methods},
            "runs": [r.to_json() for r in self.runs],
            "speedup_by_batch": {m: {str(b): x for b, x in v.items()} for m, v in self.speedups().items()},
            "predicted_speedup_by_batch": self._predicted(rule),
            "auto_off_batch": self._auto_off(rule),
            "rule": None if rule is None else rule.to_json(),
        }

    def _predicted(self, rule: BatchRule | None) -> dict[str, dict[str, float | None]]:
        if rule is None:
            return {}
        return {
            m: {
                str(b): rule.predicted_speedup(setting_label(self.config.spec(m)), b)
                for b in rule.batch_sizes
            }
            for m in self.config.methods
            if m != "plain"
        }

    def _auto_off(self, rule: BatchRule | None) -> dict[str, int | None]:
        if rule is None:
            return {}
        return {
            m: rule.auto_off_batch(setting_label(self.config.spec(m)))
            for m in self.config.methods
            if m != "plain"
        }

    def markdown(self) -> str:
        rule = self.rule()
        predicted = self._predicted(rule)
        speedups = self.speedups()
        spec_methods = [m for m in self.config.methods if m != "plain"]
        head = ["B", "plain tok/s"] + [f"{m} tok/s (x meas / x pred)" for m in spec_methods]
        head += [f"{m} p50 latency s" for m in self.config.methods]
        head += [f"{m} time: rounds / prefill / other %" for m in self.config.methods]
        lines = [
            f"# batched decoding: {self.prompts} ({self.prompt_kind or 'file'}), {self.device}, {self.dtype}, "
            f"{self.config.max_new_tokens} new tokens, {self.date}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for b in self.config.batch_sizes:
            plain = self.run("plain", b)
            cells = [str(b), f"{plain.tokens_per_s:,.0f}" if plain else "-"]
            for m in spec_methods:
                r = self.run(m, b)
                meas = speedups.get(m, {}).get(b)
                pred = predicted.get(m, {}).get(str(b))
                cells.append("-" if r is None else f"{r.tokens_per_s:,.0f} ({_x(meas)} / {_x(pred)})")
            for m in self.config.methods:
                r = self.run(m, b)
                p50 = None if r is None else r.to_json()["latency_p50_s"]
                cells.append("-" if p50 is None else f"{p50:.2f}")
            for m in self.config.methods:
                r = self.run(m, b)
                cells.append("-" if r is None else _shares(r))
            lines.append("| " + " | ".join(cells) + " |")
        if rule is not None:
            lines += ["", "```", rule.describe(), "```"]
        return "\n".join(lines) + "\n"

    def write(self, out: Path, *, plots: bool = True) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "batch_bench.json", out / "batch_bench.md"]
        atomic_write_json(paths[0], self.to_json())
        atomic_write_text(paths[1], self.markdown())
        if plots:
            plot = _plot(self, out / "batch_speedup.png")
            if plot is not None:
                paths.append(plot)
        return paths


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _shares(run: BatchRun) -> str:
    """'71 / 9 / 20' (+ the slow rounds): where a run's wall time went, in percent."""
    total = run.seconds or 1.0
    parts = (run.rounds_seconds, run.prefill_seconds, run.other_seconds)
    text = " / ".join(f"{100 * x / total:.0f}" for x in parts)
    return text + (f", {run.slow_rounds} slow rounds" if run.slow_rounds else "")


def _plot(report: BatchBenchReport, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is missing: no plot")
        return None
    predicted = report._predicted(report.rule())
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, values in report.speedups().items():
        sizes = sorted(values)
        line = ax.plot(sizes, [values[b] for b in sizes], marker="o", label=f"{method} measured")[0]
        pred = {b: x for b, x in predicted.get(method, {}).items() if x is not None}
        pred_sizes = [b for b in sizes if str(b) in pred]
        ax.plot(
            pred_sizes,
            [pred[str(b)] for b in pred_sizes],
            linestyle="--",
            color=line.get_color(),
            label=f"{method} predicted",
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (concurrent requests)")
    ax.set_ylabel("speed-up over plain decoding")
    ax.set_title(f"{report.prompts}: {report.device}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_batch_benchmark(
    target: LoadedTarget,
    draft_dir: Path | None,
    prompt_set: PromptSet,
    cfg: BatchBenchConfig,
    *,
    command: str = "",
    max_seq_len: int | None = None,
) -> BatchBenchReport:
    """Every method of `cfg` at every batch size, on one runner (and one drafter) of the largest."""
    from eaglewire.draft.io import load_draft
    from eaglewire.engine.api import check_draft_fits_target
    from eaglewire.engine.runners.factory import make_runner

    uses_draft = any(m != "plain" for m in cfg.methods)
    if uses_draft and draft_dir is None:
        raise ConfigError(
            "eagle-chain and eagle-tree need a draft", fix="pass --draft DIR or --methods plain"
        )
    prompts = [encode_prompt(target.tokenizer, p, chat=cfg.chat) for p in prompt_set.prompts]
    if not prompts:
        raise ConfigError(f"{prompt_set.name}: no prompts to run")
    rows = max(cfg.batch_sizes)
    tree_tokens = max(cfg.chain.num_draft_tokens, cfg.tree.num_draft_tokens) if uses_draft else 0
    positions = model_positions(target.config)
    fit = ContextFit.of(positions=positions, capacity=max_seq_len, tree_tokens=tree_tokens)
    lengths = [(p.prompt_id, len(ids)) for p, ids in zip(prompt_set.prompts, prompts, strict=True)]
    fit.check_all(lengths, cfg.max_new_tokens, where=f"prompt set {prompt_set.name}")  # before any work
    longest = max(n for _, n in lengths) + cfg.max_new_tokens + tree_tokens
    seq_len = max_seq_len or (longest if positions is None else min(longest, positions))
    draft = contract = None
    boundaries: tuple[int, ...] = ()
    if draft_dir is not None and uses_draft:
        draft, contract = load_draft(Path(draft_dir), device=target.device, dtype=target.dtype)
        check_draft_fits_target(contract, target)
        boundaries = tuple(contract.aux_boundaries)
    runner = make_runner(target, boundaries, "fast", max_batch_size=rows, max_seq_len=seq_len)
    if not isinstance(runner, FastTargetRunner):
        raise ConfigError("--batch-sizes needs the fast runtime (a Llama-family target)")
    widest = max((s for s in (cfg.chain, cfg.tree)), key=lambda s: s.topk * s.num_steps)
    drafter = None
    if draft is not None:
        drafter = BatchDrafter(draft, widest, max_rows=rows, max_seq_len=seq_len)
    report = BatchBenchReport(
        prompts=prompt_set.name,
        prompt_kind=prompt_set_kind(prompt_set.name),
        device=describe_device(target.device),
        dtype=dtype_name(target.dtype),
        config=cfg,
        command=command,
    )
    eos = frozenset(target.eos_token_ids)
    plain_tokens: dict[int, list[list[int]]] = {}
    for batch in cfg.batch_sizes:
        count = max(len(prompts), 2 * batch)
        workload = [prompts[i % len(prompts)] for i in range(count)]
        for method in cfg.methods:
            spec = cfg.spec(method)
            engine = BatchEngine(
                runner, drafter if spec is not None else None, max_rows=batch, policy=_always(spec)
            )
            if cfg.warmup:
                _decode(engine, workload, cfg.max_new_tokens, eos)
            engine.stats = RoundStats()
            run, tokens = _timed(engine, workload, cfg.max_new_tokens, eos, method, batch, spec)
            if method == "plain":
                plain_tokens[batch] = tokens
            elif batch in plain_tokens:
                run.matches_plain = sum(a == b for a, b in zip(tokens, plain_tokens[batch], strict=True))
            report.runs.append(run)
            log.info(
                "batch %d %s: %.0f tok/s, tau %.2f, round %.2f ms",
                batch,
                method,
                run.tokens_per_s,
                run.tau,
                1e3 * (run.round_seconds or 0.0),
            )
    return report


def _always(spec: SpecArgs | None) -> Policy:
    return lambda _running: spec


def _decode(engine: BatchEngine, prompts: list[list[int]], max_new_tokens: int, eos: frozenset[int]) -> None:
    engine.run([BatchRequest(list(p), StopRule(max_new_tokens, eos)) for p in prompts])


def _timed(
    engine: BatchEngine,
    workload: list[list[int]],
    max_new_tokens: int,
    eos: frozenset[int],
    method: str,
    batch: int,
    spec: SpecArgs | None,
) -> tuple[BatchRun, list[list[int]]]:
    requests = [BatchRequest(list(p), StopRule(max_new_tokens, eos)) for p in workload]
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    t0 = time.perf_counter()
    for request in requests:
        engine.submit(request)
    outcomes = {}
    while not engine.idle:
        for outcome in engine.step():
            outcomes[id(outcome.request)] = outcome
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    seconds = time.perf_counter() - t0
    traces = [outcomes[id(r)].trace for r in requests]
    rounds = sum(t.num_verifications for t in traces)
    emitted = sum(sum(t.emitted_per_round) for t in traces)
    stats = engine.stats
    bucket_rounds = stats.seconds.get((bucket_for(batch, batch), setting_label(spec)), [])
    median = statistics.median(bucket_rounds) if bucket_rounds else None
    run = BatchRun(
        method=method,
        batch=batch,
        requests=len(requests),
        tokens=sum(len(t.token_ids) for t in traces),
        seconds=seconds,
        latencies=[outcomes[id(r)].finished_at - t0 for r in requests],
        tau=emitted / max(rounds, 1),
        round_seconds=median,
        rounds=sum(len(v) for v in stats.seconds.values()),
        rounds_seconds=sum(sum(v) for v in stats.seconds.values()),
        prefill_seconds=stats.prefill_seconds,
        slow_rounds=0 if median is None else sum(x > 3 * median for x in bucket_rounds),
    )
    return run, [t.token_ids for t in traces]
