"""Where training metrics go: `metrics.jsonl` (always), TensorBoard (when asked), a tqdm progress bar.

One JSON object per line: {"split": "train"|"eval", "step": optimizer step, "loss", "loss_per_step",
"acc", "cond_acc", "oov_masked", "valid_rows", ...} (train lines add lr, grad_norm, tokens,
tokens_per_s). Only the main process writes.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_text

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def truncate_metrics(path: Path, *, after_step: int) -> None:
    """Drop lines of steps later than `after_step` (written by a run that was interrupted after its checkpoint)."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line)["step"] <= after_step
    ]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def open_tensorboard(directory: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "tensorboard=true but the tensorboard package is not installed",
            fix="pip install tensorboard, or leave TensorBoard off (metrics.jsonl is always written)",
        ) from None
    return SummaryWriter(log_dir=str(directory))


class MetricsSink:
    def __init__(self, out_dir: Path, *, enabled: bool, tensorboard: bool, resume_step: int | None) -> None:
        self.enabled = enabled
        self.path = Path(out_dir) / METRICS_FILE
        self.tb: Any = None
        if not enabled:
            return
        if resume_step is not None:
            truncate_metrics(self.path, after_step=resume_step)
        elif self.path.exists():
            self.path.unlink()
        if tensorboard:
            self.tb = open_tensorboard(Path(out_dir) / TENSORBOARD_DIR)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({k: _json_safe(v) for k, v in record.items()}) + "\n")
        if self.tb is not None:
            split, step = record["split"], int(record["step"])
            for key, value in record.items():
                if isinstance(value, int | float) and key not in ("step", "epoch"):
                    self.tb.add_scalar(f"{split}/{key}", value, step)
                elif isinstance(value, list) and key in ("acc", "cond_acc", "loss_per_step"):
                    for s, v in enumerate(value):
                        if isinstance(v, float) and math.isfinite(v):
                            self.tb.add_scalar(f"{split}/{key}_{s}", v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def format_postfix(summary: dict[str, Any], tokens_per_s: float, max_steps_shown: int = 4) -> str:
    accs = summary.get("acc", [])[:max_steps_shown]
    acc = "/".join("-" if not (isinstance(a, float) and math.isfinite(a)) else f"{a:.2f}" for a in accs)
    return f"loss {summary['loss']:.3f} acc {acc} tok/s {tokens_per_s:,.0f}"


def budget_steps(
    planned: int, step: int, elapsed: float, since: tuple[int, float], max_seconds: float
) -> int:
    """The optimizer step a run with a wall-time budget will likely end at: its pace since `since`
    (step, training seconds) carried on to `max_seconds`, at most `planned` (the schedule's span). That
    span is only an estimate when the clock bounds the run: a bar over it ended at 63% (the gpu preset)
    or at 0.03% (epochs=10_000)."""
    steps, seconds = step - since[0], elapsed - since[1]
    if steps <= 0 or seconds <= 0:
        return planned
    return min(planned, step + max(0, math.ceil((max_seconds - elapsed) * steps / seconds)))


class Progress:
    """tqdm over optimizer steps (main process only; off when `enabled` is False). With a wall-time
    budget (`max_seconds`) its total follows `budget_steps`, so the bar and its ETA end with the clock."""

    def __init__(self, *, total: int, initial: int, enabled: bool, max_seconds: float = 0.0) -> None:
        self.bar: Any = None
        self.planned, self.max_seconds = total, max_seconds
        self.since: tuple[int, float] | None = None  # (step, training seconds) at the first update
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def update(self, summary: dict[str, Any], tokens_per_s: float, *, step: int, elapsed: float) -> None:
        """After optimizer step `step`, with `elapsed` training seconds (resumes included) so far."""
        if self.bar is None:
            return
        self.bar.set_postfix_str(format_postfix(summary, tokens_per_s), refresh=False)
        if self.max_seconds:
            self.since = self.since or (step, elapsed)  # the pace from here: compilation and warm-up left out
            self.bar.total = budget_steps(self.planned, step, elapsed, self.since, self.max_seconds)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
