"""A sweep's settings saved as each one finishes, so a sweep cut short (a time limit, a lost
machine) keeps what it measured and a rerun measures only the rest.

`sweep.partial.json` beside `sweep.json` holds what identifies the run (`SweepKey`) and every
finished setting's `MethodResult` (its runs' tokens too, so greedy comparisons and the served-text
prediction work on restored settings). It is rewritten atomically after each setting and removed
once `sweep.json` is written (`bench.sweep.write_sweep`). A rerun whose key differs stops, naming
the differing fields."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eaglewire.bench.results import MethodResult
from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json, sha256_json
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)

PARTIAL_FILE = "sweep.partial.json"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SweepKey:
    """What must match for saved settings to be reused: same target, draft, prompts (by their token
    ids, chat template applied), lengths, timing protocol and device."""

    target: str
    draft: str
    prompts: str
    prompt_ids_sha256: str
    max_new_tokens: int
    warmup: int
    repeats: int
    device: str

    @classmethod
    def of(cls, *, target: str, draft: str, prompts: str, prompt_ids: list[list[int]], max_new_tokens: int,
           warmup: int, repeats: int, device: str) -> SweepKey:  # fmt: skip
        return cls(target, draft, prompts, sha256_json(prompt_ids), max_new_tokens, warmup, repeats, device)


class SweepProgress:
    """The finished settings of one sweep, by name ('plain', 'steps8-topk8-nodes128', ...)."""

    def __init__(self, path: Path, key: SweepKey, *, resume: bool = True) -> None:
        self.path = Path(path)
        self.key = key
        self.results: dict[str, MethodResult] = {}
        if resume and self.path.exists():
            self.results = self._load()
        self.resumed = list(self.results)  # names measured by an earlier run, reused here

    def _load(self) -> dict[str, MethodResult]:
        data = read_json_file(self.path)
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path}: schema_version expected {SCHEMA_VERSION}, got {data.get('schema_version')!r}",
                fix=f"delete {self.path} (or pass --no-sweep-resume) to measure every setting again",
            )
        saved, now = data.get("key", {}), asdict(self.key)
        diffs = [f"{k}: saved={saved.get(k)!r} now={v!r}" for k, v in now.items() if saved.get(k) != v]
        if diffs:
            raise ConfigError(
                f"{self.path} holds settings of a different sweep:\n  " + "\n  ".join(diffs),
                fix=f"rerun with the saved values, or delete {self.path} (or pass --no-sweep-resume) "
                "to start over",
            )
        results = {name: MethodResult.from_json(r) for name, r in data.get("results", {}).items()}
        if results:
            log.info(
                "sweep: resuming from %s (saved %s): %d setting(s) already measured (%s); "
                "--no-sweep-resume measures them again",
                self.path, data.get("saved_at", "?"), len(results), ", ".join(results),
            )  # fmt: skip
        return results

    def get(self, name: str) -> MethodResult | None:
        return self.results.get(name)

    def record(self, name: str, result: MethodResult, *, saved_at: str) -> None:
        """Add a finished setting and rewrite the file (atomically: a cut leaves the last one whole)."""
        self.results[name] = result
        data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "saved_at": saved_at,
            "key": asdict(self.key),
            "results": {n: r.to_json() for n, r in self.results.items()},
        }
        atomic_write_json(self.path, data)
