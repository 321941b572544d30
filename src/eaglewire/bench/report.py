"""A benchmark run's report: JSON, a Markdown table, and where they are written.

report.write(out_dir)  ->  bench.json, bench.md, and the PNG plots (eaglewire.bench.plots)
"""

from __future__ import annotations

import datetime
import logging
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eaglewire.bench.divergence import REFERENCE, ROUNDING, THIS_METHOD
from eaglewire.bench.results import CYCLE_PHASES, Cause, MethodResult, Mismatch
from eaglewire.io_utils import atomic_write_json, atomic_write_text
from eaglewire.predict.predictor import PredictionRow, prediction_markdown, prediction_summary
from eaglewire.predict.served import ServedPrediction, served_markdown, served_summary

log = logging.getLogger(__name__)

REPORT_JSON = "bench.json"
REPORT_MD = "bench.md"
SCHEMA_VERSION = 1


def describe_device(device: torch.device | str) -> str:
    """'NVIDIA H200 (cuda:0)' or 'cpu (x86_64, 2 threads)'."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} (cuda:{index})"
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class BenchReport:
    # target, draft, prompts, device, dtype, max_new_tokens, warmup, repeats, date, command
    meta: dict[str, Any]
    results: dict[str, MethodResult]  # method name -> result, in run order
    reference: str | None  # the method greedy outputs are compared with
    predictions: list[PredictionRow] = field(default_factory=list)  # offline predicted vs measured tau
    # the offline replay over the text each speculative setting served, vs its measured tau
    served_predictions: list[ServedPrediction] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            **self.meta,
            "reference_method": self.reference,
            "methods": {name: r.to_json() for name, r in self.results.items()},
            "greedy_mismatches": self.mismatch_count(),
            "predictions": [p.to_json() for p in self.predictions],
            "prediction_summary": prediction_summary(self.predictions),
            "served_predictions": [p.to_json() for p in self.served_predictions],
            "served_prediction_summary": served_summary(self.served_predictions),
        }

    def mismatch_count(self) -> int:
        return sum(len(r.mismatches or []) for r in self.results.values())

    def write(self, out_dir: Path, *, plots: bool = True) -> list[Path]:
        """bench.json, bench.md and (when `plots`) PNG files in `out_dir`; returns the paths."""
        out_dir = Path(out_dir)
        written: list[Path] = []
        if plots:
            from eaglewire.bench.plots import plot_report

            written += plot_report(self.results, self.meta, out_dir)
        self.files = [p.name for p in written] + [REPORT_JSON, REPORT_MD]
        atomic_write_text(out_dir / REPORT_MD, self.markdown())
        atomic_write_json(out_dir / REPORT_JSON, self.to_json())
        return [*written, out_dir / REPORT_JSON, out_dir / REPORT_MD]

    def markdown(self) -> str:
        m = self.meta
        lines = [
            f"# eaglewire bench: {m.get('prompts', '?')} ({m.get('num_prompts', '?')} prompts)",
            "",
            f"target `{m.get('target')}`, draft `{m.get('draft')}`, {m.get('device')}, {m.get('dtype')}, "
            f"max_new_tokens={m.get('max_new_tokens')}, warm-up {m.get('warmup')}, median of {m.get('repeats')}, "
            f"{m.get('date')}",
            "",
            markdown_table(self.results, self.reference),
        ]
        notes = [
            f"- `{r.method}`: not available: {r.reason}" for r in self.results.values() if not r.available
        ]
        for r in self.results.values():
            for mm in r.mismatches or []:
                notes.append(
                    f"- `{r.method}` differs from `{self.reference}` on {mm.prompt_id} at generated token "
                    f"{mm.position}: {mm.token} vs {mm.reference_token}{_margin_note(mm)}"
                )
        if notes:
            lines += ["", *notes]
        by_category = category_markdown(self.results)
        if by_category:
            lines += ["", "tau by prompt category:", "", by_category]
        if self.predictions:
            lines += ["", "Offline predicted vs measured tau:", "", prediction_markdown(self.predictions)]
        if self.served_predictions:
            lines += [
                "",
                "Prediction on the served text vs measured tau:",
                "",
                served_markdown(self.served_predictions),
            ]
        if m.get("command"):
            lines += ["", f"Command: `{m['command']}`"]
        return "\n".join(lines) + "\n"


def category_markdown(results: dict[str, MethodResult]) -> str:
    """One row per prompt category, one column per speculative method: its tau over that category's
    prompts; "" unless the prompts fall into at least two categories."""
    methods = {name: r.tau_by_category for name, r in results.items() if r.tau_by_category}
    cats = list(dict.fromkeys(c for by in methods.values() for c in by))
    if len(cats) < 2:
        return ""
    prompts = {c: sum(1 for r in next(iter(results.values())).runs if r.category == c) for c in cats}
    lines = ["| category | prompts | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for c in cats:
        lines.append(
            f"| {c} | {prompts[c]} | " + " | ".join(_fmt(by.get(c), ".2f") for by in methods.values()) + " |"
        )
    return "\n".join(lines)


def _margin_note(mm: Mismatch) -> str:
    """The target's margin at a first difference (eaglewire.bench.divergence), and what it means."""
    if mm.margin is None or mm.cause is None:
        return ""
    return f" (the target's logit margin there {mm.margin:.3f}: {_MEANING[mm.cause]})"


_MEANING: dict[Cause, str] = {
    ROUNDING: "a near-tie: rounding",
    THIS_METHOD: "NOT a near-tie: a bug in this method",
    # negative beyond the tie: the reference's (plain's) incremental decode, not this method, left
    # the target's own forward; a finding about the reference, not a fault of this method
    REFERENCE: "the target's own forward prefers this method's token: the reference drifted there, "
    "not a bug in this method",
}


def _ties_note(mismatches: list[Mismatch]) -> str:
    """What explains the differences, for the greedy column: ', all at near-ties', ', 1 where the
    reference parts from the target, the rest at near-ties', ', k NOT at a near-tie (a bug)', ...
    (nothing when none was measured). Only `THIS_METHOD` differences count as bugs."""
    causes = [m.cause for m in mismatches if m.cause is not None]
    if not causes:
        return ""
    whole = len(causes) == len(mismatches)
    bugs, drifts, ties = (causes.count(c) for c in (THIS_METHOD, REFERENCE, ROUNDING))
    if not bugs and not drifts:
        return ", all at near-ties" if whole else ", measured ones at near-ties"
    parts = []
    if bugs:
        parts.append(f"{bugs} NOT at a near-tie (a bug)")
    if drifts:
        parts.append(f"{drifts} where the reference parts from the target's forward")
    if ties:
        parts.append("the rest at near-ties" if whole else f"{ties} at near-ties")
    return ", " + ", ".join(parts)


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def markdown_table(results: dict[str, MethodResult], reference: str | None) -> str:
    """One row per method: tok/s, speedups, tau, per-position acceptance, cycle phases, greedy check."""
    head = (
        "| method | setting | tok/s | vs plain | vs HF generate | decode-only tok/s | decode vs plain | "
        "ms/forward | tau | acceptance per position | draft / verify / accept / host | greedy == "
        + (reference or "-")
        + " |"
    )
    rows = [head, "|" + "---|" * 12]
    for r in results.values():
        setting = ", ".join(f"{k}={v}" for k, v in r.settings.items()) or "-"
        if not r.available:
            rows.append(f"| {r.method} | {setting} | not available: {r.reason} |" + " |" * 9)
            continue
        acc = " ".join(f"{a:.2f}" for a in r.per_position_acceptance) or "-"
        frac = r.cycle_fraction
        phases = " / ".join(f"{100 * frac[k]:.0f}%" for k in CYCLE_PHASES) if frac else "-"
        if r.method == reference:
            greedy = "(reference)"
        elif r.mismatches is None:
            greedy = "-"
        else:
            greedy = (
                "yes"
                if not r.mismatches
                else f"NO ({len(r.mismatches)}/{len(r.runs)} prompts differ{_ties_note(r.mismatches)})"
            )
        rows.append(
            f"| {r.method} | {setting} | {_fmt(r.tokens_per_s, '.1f')} | {_fmt(r.speedup_vs_plain, '.2f', 'x')} | "
            f"{_fmt(r.speedup_vs_hf_generate, '.2f', 'x')} | {_fmt(r.decode_tokens_per_s, '.1f')} | "
            f"{_fmt(r.decode_speedup_vs_plain, '.2f', 'x')} | {_fmt(r.decode_ms_per_forward, '.2f')} | "
            f"{_fmt(r.tau, '.2f')} | {acc} | {phases} | {greedy} |"
        )
    return "\n".join(rows)
