"""Sweep num_steps x topk x num_draft_tokens (x batch size) and record the fastest setting.

The grid (its defaults, and which combinations run or are skipped with a reason) is
`bench.sweep_grid`.

Batch size: eaglewire's speculative decoder is batch 1, so every speculative setting runs at
batch 1; for larger batch sizes only plain batched decoding is measured (its throughput, for
reference) and that batch size's best is "plain". `best_setting.json` (the file
`eaglewire export` reads from the draft directory) holds the batch-1 winner:

    {"num_steps", "topk", "num_draft_tokens", "batch_size", "tokens_per_s", "tau", "source"}

Each finished setting is saved at once (`sweep_progress`): a sweep cut short keeps what it
measured, and rerunning the same sweep measures only the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewire.bench.engine_adapter import Outcome, load_engine, make_plain_runner, plain_fn, speculative_fn
from eaglewire.bench.harness import Workload, measure_method, spec_settings
from eaglewire.bench.prompts import PromptSet
from eaglewire.bench.report import describe_device, now_iso
from eaglewire.bench.results import MethodResult, PromptRun, compare_outputs
from eaglewire.bench.sweep_grid import (
    DEFAULT_NUM_DRAFT_TOKENS,
    DEFAULT_NUM_STEPS,
    DEFAULT_TOPK,
    Skipped,
    sweep_settings,
)
from eaglewire.bench.sweep_progress import PARTIAL_FILE, SweepKey, SweepProgress
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json
from eaglewire.predict.predictor import PredictionRow, TauPredictor, prediction_rows
from eaglewire.predict.served import (
    ServedInputs,
    ServedPrediction,
    served_markdown,
    served_predictions,
    served_summary,
)
from eaglewire.target.loading import LoadedTarget
from eaglewire.typed_config import help_field

log = logging.getLogger(__name__)

BEST_SETTING_FILE = "best_setting.json"  # the name eaglewire.export.launch reads
SPECULATIVE_MAX_BATCH = 1


@dataclass(frozen=True)
class SweepConfig:
    num_steps: tuple[int, ...] = help_field(
        "SGLang --speculative-num-steps values", default=DEFAULT_NUM_STEPS
    )
    topk: tuple[int, ...] = help_field(
        "SGLang --speculative-eagle-topk values (1 = chain)", default=DEFAULT_TOPK
    )
    num_draft_tokens: tuple[int, ...] = help_field(
        "SGLang --speculative-num-draft-tokens values (trees; chains use num_steps + 1)",
        default=DEFAULT_NUM_DRAFT_TOKENS,
    )
    batch_sizes: tuple[int, ...] = help_field(
        "batch sizes (speculative decoding runs at batch 1)", default=(1,)
    )
    max_new_tokens: int = help_field("most tokens generated per prompt", default=256)
    warmup: int = help_field("untimed runs of each prompt per setting, before its timed runs", default=1)
    repeats: int = help_field("timed runs per prompt; the median is used", default=1)
    chat: bool = help_field("apply the target's chat template", default=True)
    served_prediction: bool = help_field(
        "also predict each setting's tau offline on the very text it served (eaglewire.predict.served): "
        "beside measured tau that error is numerics alone",
        default=True,
    )

    def __post_init__(self) -> None:
        for name in ("num_steps", "topk", "num_draft_tokens", "batch_sizes"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ConfigError(f"{name}: expected positive integers, got {list(values)}")


@dataclass
class SweepRow:
    setting: dict[str, Any]  # num_steps, topk, num_draft_tokens, batch_size (or method=plain)
    tokens_per_s: float | None
    tau: float | None
    speedup_vs_plain: float | None = None
    greedy_matches_plain: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.setting, "tokens_per_s": self.tokens_per_s, "tau": self.tau,
                "speedup_vs_plain": self.speedup_vs_plain, "greedy_matches_plain": self.greedy_matches_plain}  # fmt: skip


@dataclass
class SweepResult:
    rows: list[SweepRow]
    skipped: list[Skipped]
    best_per_batch: dict[int, SweepRow]
    predictions: list[PredictionRow]
    meta: dict[str, Any] = field(default_factory=dict)
    served: list[ServedPrediction] = field(default_factory=list)  # per setting, on the text it served

    def best_setting(self) -> dict[str, Any] | None:
        """The batch-1 winner in best_setting.json form (None when no speculative setting ran)."""
        best = self.best_per_batch.get(SPECULATIVE_MAX_BATCH)
        if best is None or "topk" not in best.setting:
            return None
        keys = ("num_steps", "topk", "num_draft_tokens", "batch_size")
        return {**{k: best.setting[k] for k in keys}, "tokens_per_s": best.tokens_per_s, "tau": best.tau,
                "source": self.meta.get("source", "")}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            **self.meta,
            "rows": [r.to_json() for r in self.rows],
            "skipped": [{**s.setting, "reason": s.reason} for s in self.skipped],
            "best_per_batch_size": {str(b): r.to_json() for b, r in sorted(self.best_per_batch.items())},
            "best_setting": self.best_setting(),
            "predictions": [p.to_json() for p in self.predictions],
            "served_predictions": [p.to_json() for p in self.served],
            "served_prediction_summary": served_summary(self.served),
        }


def _plain_batched(
    work: Workload,
    runner_fn: Callable[[list[list[int]], int], list[Outcome]],
    batch_size: int,
    warmup: int,
    repeats: int,
) -> MethodResult:
    """Plain decoding of all prompts `batch_size` at a time; one 'run' per batch."""
    chunks = [work.prompt_ids[i : i + batch_size] for i in range(0, len(work.prompt_ids), batch_size)]
    for _ in range(warmup):
        runner_fn(chunks[0], work.max_new_tokens)
    runs = []
    for c, chunk in enumerate(chunks):

        def run(chunk: list[list[int]] = chunk) -> list[Outcome]:
            return runner_fn(chunk, work.max_new_tokens)

        timed = work.watch.measure(run, warmup=0, repeats=repeats)
        outs = timed.value
        tokens = [t for o in outs for t in o.token_ids]
        runs.append(
            PromptRun(f"batch{c}", sum(len(p) for p in chunk), tokens, timed.seconds, timed.all_seconds)
        )
    return MethodResult(
        f"plain-b{batch_size}", available=True, settings={"batch_size": batch_size}, runs=runs
    )


def run_sweep(
    target: LoadedTarget,
    draft_dir: Path,
    prompts: PromptSet,
    cfg: SweepConfig,
    *,
    predictor: TauPredictor | None = None,
    source: str = "",
    progress_dir: Path | None = None,
    resume: bool = True,
) -> SweepResult:
    """Measure every valid setting on `prompts`; the fastest per batch size; predicted vs measured tau.
    progress_dir: where each finished setting is saved at once (`sweep_progress`); with `resume`,
    the settings a cut-short run saved there are reused, not measured again."""
    specs, skipped = sweep_settings(cfg.num_steps, cfg.topk, cfg.num_draft_tokens)
    if not specs:
        raise ConfigError("sweep: no valid (num_steps, topk, num_draft_tokens) combination in the grid")
    work = Workload.build(target, prompts, max_new_tokens=cfg.max_new_tokens, chat=cfg.chat)
    progress = None
    if progress_dir is not None:
        key = SweepKey.of(
            target=str(target.path), draft=str(draft_dir), prompts=prompts.name, prompt_ids=work.prompt_ids,
            max_new_tokens=cfg.max_new_tokens, warmup=cfg.warmup, repeats=cfg.repeats,
            device=describe_device(target.device),
        )  # fmt: skip
        progress = SweepProgress(Path(progress_dir) / PARTIAL_FILE, key, resume=resume)
    engine = load_engine(
        target, draft_dir, max_seq_len=work.max_seq_len(max(s.num_draft_tokens for s in specs))
    )

    def measured_once(name: str, fn: Callable[[], MethodResult]) -> MethodResult:
        saved = None if progress is None else progress.get(name)
        if saved is not None:
            return saved
        result = fn()
        if progress is not None:
            progress.record(name, result, saved_at=now_iso())
        return result

    plain1 = plain_fn(engine, make_plain_runner(engine, 1))
    plain = measured_once(
        "plain",
        lambda: measure_method(
            "plain", lambda ids, n: plain1([ids], n)[0], work, warmup=cfg.warmup, repeats=cfg.repeats
        ),
    )
    plain_tps = plain.tokens_per_s
    rows: list[SweepRow] = [SweepRow({"method": "plain", "batch_size": 1}, plain_tps, None, 1.0, None)]
    best: dict[int, SweepRow] = {}
    measured: list[tuple[SpecArgs, float | None]] = []
    served_inputs: dict[str, tuple[SpecArgs, MethodResult]] = {}
    for spec in specs:
        name = f"steps{spec.num_steps}-topk{spec.topk}-nodes{spec.num_draft_tokens}"

        def measure(name: str = name, spec: SpecArgs = spec) -> MethodResult:
            return measure_method(
                name, speculative_fn(engine, spec), work, warmup=cfg.warmup, repeats=cfg.repeats
            )

        r = measured_once(name, measure)
        served_inputs[name] = (spec, r)
        row = SweepRow(
            {**spec_settings(spec), "batch_size": SPECULATIVE_MAX_BATCH},
            r.tokens_per_s,
            r.tau,
            (r.tokens_per_s / plain_tps) if r.tokens_per_s and plain_tps else None,
            not compare_outputs(r.runs, plain.runs),
        )
        rows.append(row)
        measured.append((spec, r.tau))
        if row.tokens_per_s is not None and (
            1 not in best or row.tokens_per_s > (best[1].tokens_per_s or 0.0)
        ):
            best[1] = row
    for b in sorted(set(cfg.batch_sizes) - {SPECULATIVE_MAX_BATCH}):
        pr = _plain_batched(work, plain_fn(engine, make_plain_runner(engine, b)), b, cfg.warmup, cfg.repeats)
        row = SweepRow({"method": "plain", "batch_size": b}, pr.tokens_per_s, None,
                       (pr.tokens_per_s / plain_tps) if pr.tokens_per_s and plain_tps else None, None)  # fmt: skip
        rows.append(row)
        best[b] = row
        log.info("batch %d: speculative decoding is batch 1 in eaglewire's engine; plain only", b)
    meta = {
        "target": str(target.path), "draft": str(draft_dir), "prompts": prompts.name,
        "num_prompts": len(prompts.prompts), "device": describe_device(target.device),
        "max_new_tokens": cfg.max_new_tokens, "date": now_iso(),
        "source": source or f"eaglewire bench --sweep on {describe_device(target.device)} at {now_iso()}",
        "resumed_settings": [] if progress is None else progress.resumed,
    }  # fmt: skip
    predictions = prediction_rows(predictor, measured)
    served: list[ServedPrediction] = []
    if cfg.served_prediction:
        from eaglewire.draft.io import load_draft

        draft, contract = load_draft(Path(draft_dir), device=target.device)  # float32, as `eaglewire eval`
        inputs = ServedInputs(target, draft, contract, work.prompt_ids, served_inputs, predictions)
        served = served_predictions(inputs)
    return SweepResult(rows, skipped, best, predictions, meta, served)


def write_best_setting(result: SweepResult, draft_dir: Path) -> Path | None:
    """best_setting.json into the draft directory (atomic); None when no speculative setting ran."""
    best = result.best_setting()
    if best is None:
        return None
    path = Path(draft_dir) / BEST_SETTING_FILE
    atomic_write_json(path, best)
    log.info("wrote %s: %s", path, best)
    return path


def sweep_markdown(result: SweepResult) -> str:
    from eaglewire.predict.predictor import prediction_markdown, prediction_summary

    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    lines = [
        f"# eaglewire bench --sweep: {result.meta.get('prompts')} ({result.meta.get('num_prompts')} prompts)",
        "",
        f"{result.meta.get('device')}, max_new_tokens={result.meta.get('max_new_tokens')}, {result.meta.get('date')}",
        "",
        "| batch | num_steps | topk | num_draft_tokens | tok/s | vs plain | tau | greedy == plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result.rows:
        s = r.setting
        same = "-" if r.greedy_matches_plain is None else ("yes" if r.greedy_matches_plain else "NO")
        lines.append(
            f"| {s['batch_size']} | {s.get('num_steps', 'plain')} | {s.get('topk', '-')} | {s.get('num_draft_tokens', '-')} | "
            f"{f(r.tokens_per_s, '.1f')} | {f(r.speedup_vs_plain, '.2f')}x | {f(r.tau, '.2f')} | {same} |"
        )
    lines += ["", "Fastest per batch size:", ""]
    for b, r in sorted(result.best_per_batch.items()):
        what = ", ".join(f"{k}={v}" for k, v in r.setting.items() if k != "batch_size")
        lines.append(f"- batch {b}: {what} ({f(r.tokens_per_s, '.1f')} tok/s, tau {f(r.tau, '.2f')})")
    if result.skipped:
        lines += ["", f"Skipped {len(result.skipped)} combination(s):", ""]
        lines += [f"- {s.setting}: {s.reason}" for s in result.skipped]
    summary = prediction_summary(result.predictions)
    lines += [
        "",
        "## Prediction check (offline predicted tau vs measured)",
        "",
        prediction_markdown(result.predictions),
    ]
    if summary.get("settings_compared"):
        lines += ["", f"mean error {summary['mean_error']:+.2f}, mean |error| {summary['mean_abs_error']:.2f}, "
                      f"max |error| {summary['max_abs_error']:.2f}, mean |relative error| "
                      f"{100 * summary['mean_abs_relative_error']:.1f}%"]  # fmt: skip
    if result.served:
        lines += ["", "## Prediction on the served text vs measured tau", "", served_markdown(result.served)]
    return "\n".join(lines) + "\n"


def write_sweep(result: SweepResult, out_dir: Path, *, plots: bool = True) -> list[Path]:
    """sweep.json, sweep.md and (when `plots`) sweep.png / prediction.png in `out_dir`."""
    from eaglewire.io_utils import atomic_write_text
    from eaglewire.predict.predictor import prediction_summary

    out_dir = Path(out_dir)
    written = []
    spec_rows = [r for r in result.rows if "topk" in r.setting and r.tokens_per_s is not None]
    if plots and spec_rows:
        from eaglewire.bench.plots import plot_prediction, plot_sweep

        labels = [
            f"{r.setting['num_steps']}/{r.setting['topk']}/{r.setting['num_draft_tokens']}" for r in spec_rows
        ]
        written.append(plot_sweep(labels, [r.tokens_per_s or 0.0 for r in spec_rows], [r.tau or 0.0 for r in spec_rows],
                                  out_dir / "sweep.png"))  # fmt: skip
        both = [p for p in result.predictions if p.predicted_tau is not None and p.measured_tau is not None]
        if both:
            written.append(plot_prediction(
                [f"{p.setting['num_steps']}/{p.setting['topk']}/{p.setting['num_draft_tokens']}" for p in both],
                [p.predicted_tau for p in both if p.predicted_tau is not None],
                [p.measured_tau for p in both if p.measured_tau is not None],
                out_dir / "prediction.png",
            ))  # fmt: skip
    data = {**result.to_json(), "prediction_summary": prediction_summary(result.predictions)}
    atomic_write_json(out_dir / "sweep.json", data)
    atomic_write_text(out_dir / "sweep.md", sweep_markdown(result))
    (out_dir / PARTIAL_FILE).unlink(missing_ok=True)  # the whole sweep is written: its progress is not needed
    return [*written, out_dir / "sweep.json", out_dir / "sweep.md"]
