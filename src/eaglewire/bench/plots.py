"""PNG plots of benchmark results (matplotlib, imported lazily, Agg backend: no display needed).

throughput.png    tokens/s per method (bars, speedup over our plain decode on each bar)
acceptance.png    per-position acceptance of each speculative method
phases.png        draft / verify / accept / host share of a speculative cycle (stacked bars)
sweep.png         tokens/s and tau of every sweep setting
prediction.png    predicted vs measured tau per sweep setting
tau_by_context.png  tau and speed-up vs the mean prompt tokens of each prompt set (`bench.by_context`)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eaglewire.bench.results import CYCLE_PHASES, MethodResult
from eaglewire.errors import ConfigError

PHASE_COLORS = {"draft": "#4C72B0", "verify": "#DD8452", "accept": "#55A868", "host": "#8C8C8C"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigError(
            "plots need matplotlib, which is not installed", fix="pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    from eaglewire.io_utils import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    fig.clf()
    return path


def plot_report(results: Mapping[str, MethodResult], meta: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """A bench report's (`BenchReport.results`, `.meta`) throughput.png, and acceptance.png /
    phases.png when a speculative method ran."""
    plt = _pyplot()
    out: list[Path] = []
    ran = [r for r in results.values() if r.available and r.tokens_per_s is not None]
    if not ran:
        return out
    title = f"{meta.get('prompts', '')} on {meta.get('device', '')}"

    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(ran)), 4))
    bars = ax.bar([r.method for r in ran], [r.tokens_per_s or 0.0 for r in ran], color="#4C72B0")
    for bar, r in zip(bars, ran, strict=True):
        if r.speedup_vs_plain is not None:
            ax.annotate(f"{r.speedup_vs_plain:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set_ylabel("tokens/s (batch 1, prefill included)")
    ax.set_title(f"throughput: {title}")
    ax.tick_params(axis="x", rotation=30)
    out.append(_save(fig, out_dir / "throughput.png"))
    plt.close(fig)

    spec = [r for r in ran if r.per_position_acceptance]
    if spec:
        fig, ax = plt.subplots(figsize=(5, 4))
        for r in spec:
            acc = r.per_position_acceptance
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{r.method} (tau {r.tau or 0:.2f})")
        ax.set_xlabel("draft position k")
        ax.set_ylabel("fraction of cycles accepting >= k drafts")
        ax.set_ylim(0, 1.05)
        ax.legend()
        ax.set_title(f"acceptance: {title}")
        out.append(_save(fig, out_dir / "acceptance.png"))
        plt.close(fig)

    phased = [r for r in ran if r.cycle_fraction]
    if phased:
        fig, ax = plt.subplots(figsize=(max(4.0, 1.5 * len(phased)), 4))
        bottom = [0.0] * len(phased)
        for phase in CYCLE_PHASES:
            share = [100 * r.cycle_fraction[phase] for r in phased]
            ax.bar([r.method for r in phased], share, bottom=bottom, label=phase, color=PHASE_COLORS[phase])
            bottom = [b + s for b, s in zip(bottom, share, strict=True)]
        ax.set_ylabel("% of a speculative cycle")
        ax.legend()
        ax.set_title("phase breakdown")
        out.append(_save(fig, out_dir / "phases.png"))
        plt.close(fig)
    return out


def plot_sweep(
    labels: Sequence[str], tokens_per_s: Sequence[float], taus: Sequence[float], path: Path
) -> Path:
    """tokens/s (bars) and measured tau (line, right axis) per sweep setting."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(labels)), 4))
    ax.bar(labels, tokens_per_s, color="#4C72B0")
    ax.set_ylabel("tokens/s")
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    right = ax.twinx()
    right.plot(labels, taus, color="#DD8452", marker="o")
    right.set_ylabel("tau (measured)")
    ax.set_title("sweep: num_steps/topk/num_draft_tokens")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_prediction(
    labels: Sequence[str], predicted: Sequence[float], measured: Sequence[float], path: Path
) -> Path:
    """Predicted vs measured tau, one point per setting, with the y = x line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(predicted, measured, color="#4C72B0")
    for label, x, y in zip(labels, predicted, measured, strict=True):
        ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    hi = max([*predicted, *measured, 1.0]) * 1.05
    ax.plot([1.0, hi], [1.0, hi], color="#8C8C8C", linestyle="--", linewidth=1)
    ax.set_xlabel("predicted tau (offline evaluation)")
    ax.set_ylabel("measured tau (engine)")
    ax.set_title("prediction check")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_tau_by_context(
    tau: Mapping[str, Sequence[tuple[float, float]]],
    speedup: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    path: Path,
) -> Path | None:
    """tau (left) and speed-up over plain (right) against the prompt sets' mean prompt tokens, one
    line per method: `tau` / `speedup` map a method to its (mean prompt tokens, value) points."""
    if not any(tau.values()) and not any(speedup.values()):
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, series, label in (
        (left, tau, "tau (tokens per verification)"),
        (right, speedup, "speed-up over plain"),
    ):
        for method, points in series.items():
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, marker="o", label=method)
        ax.set_xlabel("mean prompt tokens of the set")
        ax.set_ylabel(label)
        if series is speedup:
            ax.axhline(1.0, color="#8C8C8C", linewidth=0.8)
        if any(series.values()):
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no speculative method ran", ha="center", transform=ax.transAxes)
    fig.suptitle(f"by context length: {title}")
    _save(fig, path)
    plt.close(fig)
    return path
