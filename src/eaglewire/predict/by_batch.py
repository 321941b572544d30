"""The speed-up of speculative decoding per batch size, predicted before serving, and the rule
`serve` decodes by (`BatchRule`).

A batched round of setting s at batch size B emits tau_s tokens per running row (tau does not
depend on B: rows never see each other) and costs round_s(B) seconds; a plain step emits one
token per row in plain(B) seconds. So

    predicted speed-up of s at B = tau_s * plain(B) / round_s(B)

The round costs come from one measurement per device (`eaglewire bench --batch-sizes`, the cost
table), tau from the draft's acceptance (the offline prediction, or a measured tau). The rule
picks, per batch size, the setting with the largest predicted speed-up, or plain decoding where
no setting beats 1.0: a server decoding by it is never slower than plain serving, as far as the
cost table holds. Batch sizes between measured ones take the next measured size up (costs grow
with B, so that errs toward plain decoding); past the largest, the largest.

Saved per device beside the draft: `<draft>/batch_rules/<device>.json` (`rule_path`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eaglewire.engine.batch.engine import Policy
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError, expected_actual
from eaglewire.io_utils import atomic_write_json

PLAIN = "plain"
RULE_DIR = "batch_rules"
RULE_VERSION = 1


def device_slug(device: str) -> str:
    """'NVIDIA H200 (cuda:0)' -> 'nvidia-h200'; 'cpu (x86_64, 2 threads)' -> 'cpu'."""
    name = device.split(" (")[0]
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def rule_path(draft_dir: Path, device: str) -> Path:
    return Path(draft_dir) / RULE_DIR / f"{device_slug(device)}.json"


@dataclass(frozen=True)
class BatchRule:
    device: str  # describe_device() of the machine the costs were measured on
    dtype: str
    taus: dict[str, float]  # setting label ("5x1x6") -> tau used for the prediction
    round_seconds: dict[str, dict[int, float]]  # "plain" and each setting -> {B: median seconds a round}
    tau_source: str = "measured"  # "measured" (bench rows) | "predicted" (the offline evaluation)
    measured_at: str = ""
    command: str = ""
    version: int = RULE_VERSION
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if PLAIN not in self.round_seconds:
            raise ConfigError(
                expected_actual("batch rule round_seconds", "a 'plain' entry", sorted(self.round_seconds))
            )
        missing = [s for s in self.taus if s not in self.round_seconds]
        if missing:
            raise ConfigError(f"batch rule: settings {missing} have a tau but no round costs")

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(self.round_seconds[PLAIN])

    def measured_size(self, batch: int) -> int:
        """The measured batch size that stands for `batch` (the next one up, else the largest)."""
        sizes = self.batch_sizes
        return next((b for b in sizes if b >= batch), sizes[-1])

    def predicted_speedup(self, setting: str, batch: int) -> float | None:
        """tau * plain(B) / round(B) at the measured size standing for `batch`; None if unmeasured."""
        b = self.measured_size(batch)
        cost = self.round_seconds.get(setting, {}).get(b)
        plain = self.round_seconds[PLAIN].get(b)
        if cost is None or plain is None or setting not in self.taus or cost <= 0:
            return None
        return self.taus[setting] * plain / cost

    def choice(self, batch: int, settings: list[str] | None = None) -> str:
        """The setting with the largest predicted speed-up at `batch` among `settings` (default all),
        or 'plain' where none beats 1.0."""
        best, best_speedup = PLAIN, 1.0
        for setting in settings if settings is not None else sorted(self.taus):
            speedup = self.predicted_speedup(setting, batch)
            if speedup is not None and speedup > best_speedup:
                best, best_speedup = setting, speedup
        return best

    def auto_off_batch(self, setting: str) -> int | None:
        """The smallest measured batch size at which `setting` is predicted to lose to plain decoding."""
        for b in self.batch_sizes:
            speedup = self.predicted_speedup(setting, b)
            if speedup is not None and speedup <= 1.0:
                return b
        return None

    def table(self) -> list[dict[str, Any]]:
        """One row per measured batch size: each setting's predicted speed-up and the choice."""
        rows = []
        for b in self.batch_sizes:
            row: dict[str, Any] = {"batch": b, "plain_round_ms": 1e3 * self.round_seconds[PLAIN][b]}
            for setting in sorted(self.taus):
                row[setting] = self.predicted_speedup(setting, b)
            row["choice"] = self.choice(b)
            rows.append(row)
        return rows

    def describe(self) -> str:
        lines = [f"batch rule for {self.device} ({self.dtype}, tau {self.tau_source}, {self.measured_at}):"]
        for row in self.table():
            parts = [f"{s} {row[s]:.2f}x" for s in sorted(self.taus) if row[s] is not None]
            lines.append(f"  B={row['batch']:>3}: " + ", ".join(parts) + f" -> {row['choice']}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["round_seconds"] = {s: {str(b): v for b, v in c.items()} for s, c in self.round_seconds.items()}
        data["predicted_speedup_by_batch"] = {
            s: {str(b): self.predicted_speedup(s, b) for b in self.batch_sizes} for s in sorted(self.taus)
        }
        data["choice_by_batch"] = {str(b): self.choice(b) for b in self.batch_sizes}
        data["auto_off_batch"] = {s: self.auto_off_batch(s) for s in sorted(self.taus)}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "batch rule") -> BatchRule:
        if data.get("version") != RULE_VERSION:
            raise ConfigError(
                expected_actual(f"{where}: version", RULE_VERSION, data.get("version")),
                fix="measure it again: eaglewire bench --batch-sizes 1,2,4,8,...",
            )
        try:
            return cls(
                device=str(data["device"]),
                dtype=str(data["dtype"]),
                taus={str(k): float(v) for k, v in data["taus"].items()},
                round_seconds={
                    str(s): {int(b): float(v) for b, v in costs.items()}
                    for s, costs in data["round_seconds"].items()
                },
                tau_source=str(data.get("tau_source", "measured")),
                measured_at=str(data.get("measured_at", "")),
                command=str(data.get("command", "")),
                notes=[str(n) for n in data.get("notes", [])],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ConfigError(f"{where}: not a batch rule ({type(err).__name__}: {err})") from err

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, self.to_json())
        return path


def load_rule(path: Path) -> BatchRule:
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the batch rule ({err})") from err
    return BatchRule.from_json(data, where=str(path))


def rule_policy(rule: BatchRule, settings: dict[str, SpecArgs]) -> Policy:
    """The engine's policy by `rule`: for a round of n running rows, the setting the rule chooses at
    the bucket holding n among `settings` (label -> SpecArgs; labels the rule has no costs for are
    never chosen), or None for plain decoding."""
    known = [label for label in settings if label in rule.taus]
    choices = {b: rule.choice(b, known) for b in rule.batch_sizes}

    def policy(running: int) -> SpecArgs | None:
        choice = choices[rule.measured_size(running)]
        return None if choice == PLAIN else settings[choice]

    return policy
