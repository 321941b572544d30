"""A quickstart run directory: the preset it runs, and each stage's marker `<stage>.json`.

A finished stage writes its typed result (`eaglewire.recipes.results`) and wall time to its marker;
a rerun reads the marker back instead of running the stage, and a stage that runs again drops the
markers of every later stage (they ran on what it redoes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json
from eaglewire.recipes.presets import QuickstartPreset
from eaglewire.recipes.results import R
from eaglewire.recipes.resume import STAGES

TARGET = "smollm2"


class Stopped(Exception):
    """The stage `QuickstartRun.stop_after` names has finished (caught by `run_quickstart`)."""


@dataclass
class StageLog:
    name: str
    seconds: float
    result: Any  # the stage's typed result
    skipped: bool = False


@dataclass
class QuickstartRun:
    preset: QuickstartPreset
    out_dir: Path
    target: str = TARGET
    stages: list[StageLog] = field(default_factory=list)
    on_stage: Callable[[str], None] | None = None
    on_target_report: Callable[[Any], None] | None = None  # gets the TargetReport when the target stage runs
    stop_after: str | None = None  # the last stage to run (None: all); a rerun without it resumes there

    def __post_init__(self) -> None:
        if self.stop_after is not None and self.stop_after not in STAGES:
            raise ConfigError(f"stop_after: expected one of {list(STAGES)}, got {self.stop_after!r}")
        # stage results record paths (the trained draft's, the exports'): absolute, so that a rerun
        # from another working directory resumes the same run instead of missing its files
        self.out_dir = Path(self.out_dir).resolve()

    def path(self, *parts: str) -> Path:
        return self.out_dir.joinpath(*parts)

    def stage(self, name: str, kind: type[R], fn: Callable[[], R]) -> R:
        """Run `fn` unless `<name>.json` records it as done (then its result, read as `kind`);
        record its result and wall time."""
        marker = self.path(f"{name}.json")
        if self.on_stage is not None:
            self.on_stage(name)
        if marker.exists():
            done = json.loads(marker.read_text())
            result = kind.from_json(done["result"])
            self.stages.append(StageLog(name, done["seconds"], result, skipped=True))
        else:
            for later in STAGES[STAGES.index(name) + 1 :]:  # they ran on what this stage now redoes
                self.path(f"{later}.json").unlink(missing_ok=True)
            start = time.perf_counter()
            result = fn()
            seconds = time.perf_counter() - start
            atomic_write_json(marker, {"stage": name, "seconds": seconds, "result": result.to_json()})
            self.stages.append(StageLog(name, seconds, result))
        if name == self.stop_after:
            raise Stopped
        return result
