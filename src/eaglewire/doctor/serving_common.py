"""What a serving engine will feed the draft: one `ServedReading` per way an engine reads the ids.

Both lints (SGLang, vLLM) turn a draft config into readings: the ids as written, the boundaries
the engine captures for them (or why it cannot), and the ids to write so that it captures the
boundaries the draft was trained on. `compare_reading` turns a reading that differs from the
trained boundaries into a finding; the standalone check reuses the readings to measure what the
difference costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eaglewire.contract.numbering import EngineReading
from eaglewire.doctor.diagnosis import describe_boundaries, diagnose_aux
from eaglewire.doctor.draft_source import DraftSource, read_draft_source
from eaglewire.doctor.findings import CheckResult, Finding, Row, fmt_list


@dataclass(frozen=True)
class ServedReading:
    """How one engine release range reads the draft's config."""

    engine: str  # "sglang" | "vllm"
    label: str  # "SGLang 0.5.10-0.5.21", "vLLM 0.33.0", ...
    ids: tuple[int, ...] | None  # as written in the config (None: absent, the engine's defaults apply)
    boundaries: tuple[int, ...] | None  # what the engine concatenates, in order; None when unreadable
    problem: str | None = None  # why stock engines cannot serve it as is (boundary 0, invalid ids)
    fix: str = ""  # the config value that makes this engine capture the trained boundaries


def served_reading(r: EngineReading, fix: str) -> ServedReading:
    """An engine table reading as the doctor compares it: boundaries only when the engine feeds the draft as many
    aux states as the ids name (a dropped or crashing capture point leaves fc without its input: unreadable)."""
    named = len(r.ids) if r.ids is not None else None
    fed = r.boundaries
    if fed is not None and named is not None and len(fed) != named:
        fed = None
    return ServedReading(
        engine=r.rule.engine.value,
        label=r.label,
        ids=r.ids,
        boundaries=fed,
        problem=r.problem,
        fix=fix,
    )


@dataclass
class ServingLint:
    """One engine's lint: its check result and its readings (for the standalone check)."""

    result: CheckResult
    readings: list[ServedReading]


def served_draft_source(
    path_text: str | None, fallback: DraftSource | None
) -> tuple[DraftSource | None, str | None]:
    """The draft config the engine reads: the engine's draft path when it is a local directory, else --draft.

    Returns (source, note); the note says which was used or why the engine's path was not read.
    """
    if path_text:
        path = Path(path_text)
        if (path / "config.json").exists():
            return read_draft_source(path, with_tensors=False), f"draft config read from {path}"
        if fallback is not None:
            return fallback, f"{path_text} is not a local directory: read --draft {fallback.path} instead"
        return None, f"{path_text} is not a local directory and no --draft was given: layer ids unchecked"
    if fallback is not None:
        return fallback, f"draft config read from --draft {fallback.path}"
    return None, "no draft path in the serving config and no --draft: layer ids unchecked"


def loadable_draft_source(
    path_text: str | None,
    fallback: DraftSource | None,
    num_layers: int | None,
    result: CheckResult,
    *,
    engine: str,
    declared: str,
    expected_format: str,
) -> DraftSource | None:
    """The engine-format draft whose layer ids can be checked, or None (with a note or a finding in `result`).

    engine: "sglang" | "vllm"; declared: how the serving config names the path (for the finding)."""
    source, note = served_draft_source(path_text, fallback)
    if note:
        result.notes.append(note)
    if source is None or num_layers is None:
        if num_layers is None:
            result.notes.append("target layer count unknown (no --target, no contract): layer ids unchecked")
        return None
    if source.kind == "eaglewire":
        name = "SGLang" if engine == "sglang" else "vLLM"
        result.findings.append(
            Finding(
                check=f"serving.{engine}.draft_format",
                severity="error",
                what=f"{name} is pointed at an eaglewire draft directory, which it cannot load",
                declared=declared,
                actual=f"format eaglewire-eagle3 ({expected_format})",
                fix=f"eaglewire export --draft {source.path} --format {engine} --out <dir>, and serve <dir>",
            )
        )
        return None
    return source


def same_directory(a: Path, b: Path | None) -> bool:
    """True when `b` is given and names the same directory as `a`."""
    if b is None:
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def reading_row(r: ServedReading, num_layers: int) -> Row:
    ids = "absent (engine defaults)" if r.ids is None else fmt_list(r.ids)
    if r.boundaries is None:
        actual = f"unreadable: {r.problem}"
    else:
        actual = f"boundaries {describe_boundaries(r.boundaries, num_layers)}"
    return Row(
        item=f"{r.label}: layer ids",
        declared=ids,
        actual=actual,
        ok=r.boundaries is not None and r.problem is None,
    )


def compare_reading(
    r: ServedReading,
    trained: Sequence[int] | None,
    num_layers: int,
    result: CheckResult,
    *,
    trained_from: str,
) -> bool:
    """Add a finding when the engine would not capture what the draft was trained on. True when it matches."""
    if r.boundaries is None:
        result.findings.append(
            Finding(
                check=f"serving.{r.engine}.layer_ids",
                severity="error",
                what=f"{r.label} cannot read the draft's layer ids",
                declared=fmt_list(r.ids),
                actual=r.problem or "unreadable",
                fix=r.fix,
            )
        )
        return False
    if trained is None:
        if r.problem:
            result.findings.append(
                Finding(
                    check=f"serving.{r.engine}.layer_ids",
                    severity="error",
                    what=f"{r.label}: {r.problem}",
                    declared=fmt_list(r.ids),
                    actual=f"boundaries {fmt_list(r.boundaries)}",
                    fix=r.fix,
                )
            )
        return r.problem is None
    if tuple(r.boundaries) == tuple(trained) and r.problem is None:
        return True
    if tuple(r.boundaries) == tuple(trained):
        what = f"{r.label}: {r.problem}"
    else:
        what = f"{r.label} feeds the draft other states than it was trained on: " + diagnose_aux(
            trained, list(r.boundaries), declared_name="training", actual_name="the engine"
        )
        if r.problem:
            what += f"; and {r.problem}"
    result.findings.append(
        Finding(
            check=f"serving.{r.engine}.layer_ids",
            severity="error",
            what=what,
            declared=f"trained on boundaries {describe_boundaries(trained, num_layers)} ({trained_from})",
            actual=f"ids {fmt_list(r.ids) if r.ids is not None else '(absent: defaults)'} -> boundaries "
            f"{describe_boundaries(r.boundaries, num_layers)}",
            fix=r.fix,
        )
    )
    return False
