"""src/ gives reasons, not lab-notebook references: no "run 31", "session 28", lease, ISO date or
"BENCHMARKS.md 2za" in a comment or docstring. Where history matters, a comment points into the kept
run log as `§2za` (docs/history/benchmarks-log.md), and every such id must name a section there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
LOG = REPO / "docs" / "history" / "benchmarks-log.md"
SUFFIXES = {".py", ".md"}

_ORDINAL = r"(?:\w+-)?(?:fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\w+teenth|\w+tieth)"
DATED = {
    "a numbered run or session": re.compile(r"\b(?:runs?|sessions?)\s+\d+", re.IGNORECASE),
    "a run's results folder name": re.compile(r"(?:\b|_)run_?\d+\b", re.IGNORECASE),
    "an ordinal run or session": re.compile(rf"\b{_ORDINAL}\s+(?:run|session|lease)\b", re.IGNORECASE),
    "a GPU lease": re.compile(r"\bleases?\b", re.IGNORECASE),
    "a date": re.compile(r"\b20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"),
    "a BENCHMARKS.md section": re.compile(
        r"BENCHMARKS\.md[,:;]?\s*(?:§|section\s+|\d+[a-z]*\b)", re.IGNORECASE
    ),
}
SECTION_POINTER = re.compile(r"§\s?(\d+[a-z]*)\b")
LOG_HEADING = re.compile(r"^#{2,3} (\d+[a-z]*)\. ", re.MULTILINE)


def dated_citations(text: str) -> list[str]:
    """'line N: what (the matched text)' for each dated citation in `text`."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in DATED.items():
            for m in pattern.finditer(line):
                found.append(f"line {n}: {what} ({m.group(0)!r})")
    return found


def source_files() -> list[Path]:
    files = sorted(p for p in SRC.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    assert len(files) > 100, f"expected the package's sources under {SRC}, found {len(files)} files"
    return files


def log_section_ids() -> set[str]:
    """Section ids of the run log (`2za`, `3`, ...); before it moves to docs/history, BENCHMARKS.md holds them."""
    log = LOG if LOG.exists() else REPO / "BENCHMARKS.md"
    return set(LOG_HEADING.findall(log.read_text(encoding="utf-8")))


@pytest.mark.parametrize(
    "text",
    [
        "measured in H200 run 31 (chain 3.73)",
        "Leases trained 540 s (runs 8-11)",
        "as session 28 found",
        "the Twenty-eighth run measured it",
        "see BENCHMARKS.md 2za",
        "(BENCHMARKS.md section 3, profile)",
        "the 2026-12-01 profile",
        "benchmarks/results/h200_quickstart_run22/",
        "its lease was lost",
    ],
)
def test_each_kind_of_dated_citation_is_found(text: str) -> None:
    assert dated_citations(text), text


@pytest.mark.parametrize(
    "text",
    [
        "came within 1-2% (docs/history/benchmarks-log.md §2p)",
        "prefills and captures run each prompt's length",
        "the SGLang release you serve with, e.g. 0.5.23",
        "torch releases the GIL in its kernels",
        "1 of 150 runs on an idle 2-core machine",
        "a 2x wider MLP, log2(max) graphs, 16 runs in a row",
        "BENCHMARKS.md has the current numbers",
    ],
)
def test_reasons_and_log_pointers_pass(text: str) -> None:
    assert dated_citations(text) == []


def test_src_cites_no_dated_runs() -> None:
    found = [
        f"{path.relative_to(REPO)} {hit}"
        for path in source_files()
        for hit in dated_citations(path.read_text(encoding="utf-8"))
    ]
    assert found == [], (
        "src/ cites dated runs: " + "; ".join(found) + ". fix= give the reason in the comment; where the "
        "history matters, point to its section of docs/history/benchmarks-log.md as '§2za'"
    )


def test_every_section_pointer_names_a_log_section() -> None:
    ids = log_section_ids()
    assert {"2a", "2ze", "3"} <= ids, f"expected the run log's section ids, read {sorted(ids)}"
    unknown = [
        f"{path.relative_to(REPO)}: §{m.group(1)}"
        for path in source_files()
        for m in SECTION_POINTER.finditer(path.read_text(encoding="utf-8"))
        if m.group(1) not in ids
    ]
    assert unknown == [], (
        f"pointers to sections the run log does not have: {unknown} (its ids: {sorted(ids)})"
    )
