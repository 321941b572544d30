"""What the doctor reports: findings (each with its one fix), per-check results and the verdict.

A `Finding` names the check, what differs, the declared and the actual value side by side, and
the one change that fixes it (the exact value to set, or the command to rerun). A `CheckResult`
groups the findings of one check with the declared-vs-actual rows it looked at and short notes
(things it could not check and why). A `DoctorReport` is the whole verdict: exit code 0 when
everything matches, 1 when anything was found. Rendering to rows/JSON lives here; the CLI only
prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning"]
Status = Literal["ok", "finding", "skipped"]

EXIT_OK = 0
EXIT_FINDING = 1
SUMMARY_WIDTH = 100


@dataclass(frozen=True)
class Finding:
    """One thing that differs, and the one change that fixes it."""

    check: str  # e.g. "data.aux", "serving.sglang.num_draft_tokens"
    severity: Severity  # "error": the draft will not see what it was trained on / runs wrong; "warning": costs speed
    what: str  # one line: what differs
    declared: str  # what the label/config/user says
    actual: str  # what the values/engine actually do
    fix: str  # the exact value to set, or the command to run
    details: tuple[str, ...] = ()  # supporting evidence (per-column distances, both numbers, ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity,
            "what": self.what,
            "declared": self.declared,
            "actual": self.actual,
            "fix": self.fix,
            "details": list(self.details),
        }

    def lines(self) -> list[str]:
        out = [
            f"[{self.severity}] {self.check}: {self.what}",
            f"    declared: {self.declared}",
            f"    actual:   {self.actual}",
        ]
        out += [f"    {d}" for d in self.details]
        out.append(f"    fix: {self.fix}")
        return out


@dataclass(frozen=True)
class Row:
    """One declared-vs-actual line of a check's table."""

    item: str
    declared: str
    actual: str
    ok: bool
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "declared": self.declared,
            "actual": self.actual,
            "ok": self.ok,
            "note": self.note,
        }


@dataclass
class CheckResult:
    """The outcome of one check: its rows, findings and notes."""

    name: str  # "data vs target", "draft vs target", "draft vs data", "serving: sglang", ...
    rows: list[Row] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not checked and why; informational facts
    skipped: bool = False

    @property
    def status(self) -> Status:
        if self.findings:
            return "finding"
        return "skipped" if self.skipped else "ok"

    def summary(self, width: int = SUMMARY_WIDTH) -> str:
        if self.findings:
            first = self.findings[0].what
            first = first if len(first) <= width else first[: width - 3] + "..."
            more = len(self.findings) - 1
            return first + (f" (+{more} more)" if more else "")
        if self.skipped:
            return self.notes[0] if self.notes else "skipped"
        return f"{len(self.rows)} item(s) match" if self.rows else (self.notes[0] if self.notes else "ok")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "rows": [r.to_json() for r in self.rows],
            "findings": [f.to_json() for f in self.findings],
            "notes": list(self.notes),
        }


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name=name, notes=[reason], skipped=True)


@dataclass
class DoctorReport:
    checks: list[CheckResult] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)  # trace stages (JSON-able), when --trace

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks for f in c.findings]

    @property
    def exit_code(self) -> int:
        return EXIT_FINDING if self.findings else EXIT_OK

    def verdict_rows(self) -> list[tuple[str, str, str]]:
        """(check, status, summary) per check: the short verdict table."""
        return [(c.name, c.status, c.summary()) for c in self.checks]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.findings,
            "exit_code": self.exit_code,
            "checks": [c.to_json() for c in self.checks],
            "findings": [f.to_json() for f in self.findings],
            "trace": self.trace,
        }

    def detail_lines(self) -> list[str]:
        """Every check's declared-vs-actual rows, notes, then every finding with its fix."""
        out: list[str] = []
        for c in self.checks:
            if not c.rows and not c.notes:
                continue
            out.append(f"{c.name}:")
            out += [format_row(r) for r in c.rows]
            out += [f"  note: {n}" for n in c.notes]
        for f in self.findings:
            out += f.lines()
        return out


def format_row(r: Row) -> str:
    mark = "ok " if r.ok else "XX "
    note = f"  ({r.note})" if r.note else ""
    return f"  {mark}{r.item}: declared {r.declared} | actual {r.actual}{note}"


def fmt_list(values: Sequence[Any] | None) -> str:
    return "none" if values is None else "[" + ", ".join(str(v) for v in values) + "]"
