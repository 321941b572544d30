"""`eaglewire bench --prompts A,B,...`: the method table on several prompt sets with one loaded model,
and how tau, per-position acceptance and speed-up change with the prompts' length.

    sets = load_prompt_sets("mt-bench,long-1k,long-4k", num_prompts)   # every set read, none decoded
    tokenizer = check_before_loading(target, sets, max_new_tokens=..., tree_tokens=..., chat=...)
    report = run_by_context(loaded, draft_dir, sets, cfg, meta=...)   # one engine for every set
    report.write(out)   # bench.json, bench.md, tau_by_context.png

The report has one row per (set, method): the set's median and mean prompt tokens, tau, per-position
acceptance, tok/s and speed-up over plain on that set; bench.json also holds each set's whole bench
report (`BenchReport.to_json`) under `sets`, and bench.md each set's table. Every prompt of every set
is checked against the target's positions (`engine.fits`) before anything is decoded: a long set
makes the runner as large as it needs, up to the model's positions, and only what cannot fit there
is refused.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglewire.bench.prompts import PromptSet, encode_prompt, load_prompt_set
from eaglewire.engine.fits import ContextFit, model_positions
from eaglewire.errors import ConfigError, EaglewireError
from eaglewire.io_utils import atomic_write_json, atomic_write_text

if TYPE_CHECKING:  # torch and the engine load when a run starts, not when `--prompts` is read
    from eaglewire.bench.harness import BenchConfig
    from eaglewire.bench.report import BenchReport
    from eaglewire.predict.predictor import TauPredictor
    from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

PLOT_FILE = "tau_by_context.png"
# keys of a set's report meta that differ between sets (the rest is the run's, shared)
_PER_SET_META = ("prompts", "num_prompts", "date")


def load_prompt_sets(spec: str, num_prompts: int | None = None) -> list[PromptSet]:
    """`--prompts`: one set, or several separated by commas (a file whose name has a comma is one set);
    each read now (the first `num_prompts` of each), so that a bad name is an error before any work."""
    if Path(spec).is_file():
        return [load_prompt_set(spec, num_prompts)]
    names = [part.strip() for part in spec.split(",")]
    if any(not n for n in names):
        raise ConfigError(
            f"--prompts {spec!r}: an empty set name", fix="separate set names or files by single commas"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"--prompts {spec!r}: {repeated} named more than once", fix="name each set once")
    sets = []
    for i, name in enumerate(names, start=1):
        try:
            sets.append(load_prompt_set(name, num_prompts))
        except EaglewireError as e:
            if len(names) == 1:
                raise
            message = str(e) if e.fix is None else str(e).split("\n  fix: ")[0]
            raise type(e)(f"--prompts: set {i} of {len(names)}, {name!r}: {message}", fix=e.fix) from None
    return sets


def check_before_loading(
    target: str, sets: Sequence[PromptSet], *, max_new_tokens: int, tree_tokens: int, chat: bool
) -> Any:
    """Every prompt of `sets`, tokenized with the target's tokenizer, within the target's positions
    (`engine.fits`), read from its directory without loading the weights; a ConfigError naming the set,
    the prompt and the lengths otherwise. Returns that tokenizer (for `load_target(tokenizer=...)`), or
    None where it cannot be had without the weights (a .gguf file): then the check runs after loading,
    still before any decoding (`Workload.max_seq_len`)."""
    from eaglewire.bench.harness import check_set_fits
    from eaglewire.target.loading import preview_target

    preview = preview_target(target)
    if preview is None or preview.tokenizer is None:
        return None
    fit = ContextFit.of(positions=model_positions(preview.config), capacity=None, tree_tokens=tree_tokens)
    for prompt_set in sets:
        ids = [encode_prompt(preview.tokenizer, p, chat=chat) for p in prompt_set.prompts]
        check_set_fits(fit, prompt_set, ids, max_new_tokens)
    return preview.tokenizer


@dataclass(frozen=True)
class ContextRow:
    """One method on one prompt set."""

    prompt_set: str
    method: str
    num_prompts: int
    prompt_tokens_median: float
    prompt_tokens_mean: float
    prompt_tokens_max: int
    available: bool
    tau: float | None  # tokens per target verification, bonus included (speculative methods)
    per_position_acceptance: list[float]  # [k] fraction of verifications accepting >= k+1 drafts
    tokens_per_s: float | None
    speedup_vs_plain: float | None  # tok/s over plain's on the same set


@dataclass
class ByContextReport:
    meta: dict[str, Any]  # the run's: target, draft, device, dtype, max_new_tokens, command, ...
    sets: dict[str, BenchReport]  # set name -> its report, in --prompts order
    prompt_tokens: dict[str, list[int]]  # set name -> each prompt's tokens, as encoded
    files: list[str] = field(default_factory=list)

    def rows(self) -> list[ContextRow]:
        out = []
        for name, report in self.sets.items():
            lengths = self.prompt_tokens[name]
            for r in report.results.values():
                out.append(
                    ContextRow(
                        prompt_set=name,
                        method=r.method,
                        num_prompts=len(lengths),
                        prompt_tokens_median=float(statistics.median(lengths)),
                        prompt_tokens_mean=statistics.fmean(lengths),
                        prompt_tokens_max=max(lengths),
                        available=r.available,
                        tau=r.tau,
                        per_position_acceptance=list(r.per_position_acceptance) if r.available else [],
                        tokens_per_s=r.tokens_per_s if r.available else None,
                        speedup_vs_plain=r.speedup_vs_plain if r.available else None,
                    )
                )
        return out

    def to_json(self) -> dict[str, Any]:
        from eaglewire.bench.report import SCHEMA_VERSION

        return {
            "schema_version": SCHEMA_VERSION,
            **self.meta,
            "prompt_sets": list(self.sets),
            "by_context": [asdict(row) for row in self.rows()],
            "greedy_mismatches": sum(r.mismatch_count() for r in self.sets.values()),
            "sets": {name: report.to_json() for name, report in self.sets.items()},
        }

    def markdown(self) -> str:
        m = self.meta
        lines = [
            f"# eaglewire bench by context: {', '.join(self.sets)} ({len(self.sets)} prompt sets)",
            "",
            f"target `{m.get('target')}`, draft `{m.get('draft')}`, {m.get('device')}, {m.get('dtype')}, "
            f"max_new_tokens={m.get('max_new_tokens')}, warm-up {m.get('warmup')}, median of {m.get('repeats')}, "
            f"{m.get('date')}",
            "",
            context_markdown(self.rows()),
        ]
        for report in self.sets.values():
            # each set's own report, one heading level down
            body = report.markdown().rstrip("\n").split("\n", 1)
            lines += ["", "#" + body[0], *body[1:]]
        return "\n".join(lines).rstrip("\n") + "\n"

    def write(self, out_dir: Path, *, plots: bool = True) -> list[Path]:
        """bench.json, bench.md and (with `plots` and 2+ sets) tau_by_context.png in `out_dir`."""
        from eaglewire.bench.report import REPORT_JSON, REPORT_MD

        out_dir = Path(out_dir)
        written: list[Path] = []
        if plots and len(self.sets) > 1:
            from eaglewire.bench.plots import plot_tau_by_context

            rows = [r for r in self.rows() if r.available]
            Points = list[tuple[float, float]]
            tau: dict[str, Points] = {r.method: [] for r in rows if r.tau is not None}
            speedup: dict[str, Points] = {
                r.method: [] for r in rows if r.method != "plain" and r.speedup_vs_plain is not None
            }
            for r in rows:
                if r.method in tau and r.tau is not None:
                    tau[r.method].append((r.prompt_tokens_mean, r.tau))
                if r.method in speedup and r.speedup_vs_plain is not None:
                    speedup[r.method].append((r.prompt_tokens_mean, r.speedup_vs_plain))
            title = f"{self.meta.get('prompts', '')} on {self.meta.get('device', '')}"
            plot = plot_tau_by_context(tau, speedup, title, out_dir / PLOT_FILE)
            if plot is not None:
                written.append(plot)
        self.files = [p.name for p in written] + [REPORT_JSON, REPORT_MD]
        atomic_write_text(out_dir / REPORT_MD, self.markdown())
        atomic_write_json(out_dir / REPORT_JSON, self.to_json())
        return [*written, out_dir / REPORT_JSON, out_dir / REPORT_MD]


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def context_markdown(rows: Sequence[ContextRow]) -> str:
    """One row per (set, method): the set's prompt lengths, then the method's tok/s, speed-up and tau."""
    lines = [
        "| prompt set | prompts | prompt tokens median / mean | method | tok/s | vs plain | tau | "
        "acceptance per position |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        lengths = f"{r.prompt_tokens_median:.0f} / {r.prompt_tokens_mean:.1f}"
        if not r.available:
            lines.append(
                f"| {r.prompt_set} | {r.num_prompts} | {lengths} | {r.method} | not available | | | |"
            )
            continue
        acc = " ".join(f"{a:.2f}" for a in r.per_position_acceptance) or "-"
        lines.append(
            f"| {r.prompt_set} | {r.num_prompts} | {lengths} | {r.method} | {_fmt(r.tokens_per_s, '.1f')} | "
            f"{_fmt(r.speedup_vs_plain, '.2f', 'x')} | {_fmt(r.tau, '.2f')} | {acc} |"
        )
    return "\n".join(lines)


def run_by_context(
    target: LoadedTarget,
    draft_dir: Path | None,
    sets: Sequence[PromptSet],
    cfg: BenchConfig,
    *,
    meta: dict[str, Any] | None = None,
    predictor: TauPredictor | None = None,
) -> ByContextReport:
    """`run_benchmark` on every set with one engine, sized for the longest prompt of them all (at
    most the target's positions); every prompt of every set is checked before the engine is built."""
    from eaglewire.bench.engine_adapter import load_engine
    from eaglewire.bench.harness import Workload, run_benchmark

    if not sets:
        raise ConfigError("--prompts: no prompt set given", fix="pass --prompts mt-bench")
    if cfg.uses_draft and draft_dir is None:
        raise ConfigError("methods eagle-chain and eagle-tree need a draft", fix="pass --draft DIR")
    works = [Workload.build(target, s, max_new_tokens=cfg.max_new_tokens, chat=cfg.chat) for s in sets]
    room = max(w.max_seq_len(cfg.max_tree_tokens) for w in works)  # checks every prompt of every set
    log.info("one engine for %d prompt sets: max_seq_len=%d", len(sets), room)
    engine = load_engine(target, draft_dir, max_seq_len=room)
    reports: dict[str, BenchReport] = {}
    for prompt_set in sets:
        log.info("prompt set %s (%d prompts)", prompt_set.name, len(prompt_set.prompts))
        reports[prompt_set.name] = run_benchmark(
            target, draft_dir, prompt_set, cfg, meta=meta, engine=engine, predictor=predictor
        )
    first = next(iter(reports.values())).meta
    shared = {k: v for k, v in first.items() if k not in _PER_SET_META}
    shared["prompts"] = ",".join(reports)
    shared["date"] = first.get("date")
    lengths = {w.prompts.name: [len(ids) for ids in w.prompt_ids] for w in works}
    return ByContextReport(meta=shared, sets=reports, prompt_tokens=lengths)
