"""Every `benchmarks/results/...` path the documentation cites exists, so a moved or deleted result
cannot leave a number without its source. Patterns are allowed where the text means a family of files:
`*`, `{a,b}`, `<set>` and an upper-case placeholder such as `SET` each stand for any name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CITED_BY = [
    "README.md",
    "BENCHMARKS.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")),
]
# A path runs until whitespace, a backtick, a quote or a closing bracket; prose punctuation is trimmed after.
PATH = re.compile(r"benchmarks/results/[^\s`'\"()\[\]]*")


def cited_paths(text: str) -> list[str]:
    return [m.group(0).rstrip(".,;:") for m in PATH.finditer(text)]


def as_glob(path: str) -> str:
    """A cited path with its placeholders turned into `*` (`{r21,r22}`, `<set>`, `SET`)."""
    path = re.sub(r"\{[^}]*\}", "*", path)
    path = re.sub(r"<[^>]*>", "*", path)
    return re.sub(r"(?<![A-Za-z0-9])[A-Z]{2,}(?![A-Za-z0-9])", "*", path)


def test_every_cited_result_path_exists() -> None:
    missing = []
    n = 0
    for rel in CITED_BY:
        text = (ROOT / rel).read_text()
        for path in cited_paths(text):
            n += 1
            pattern = as_glob(path).rstrip("/")
            if not (ROOT / pattern).exists() and not any(ROOT.glob(pattern)):
                missing.append(f"{rel}: {path}")
    assert n > 0, "no benchmarks/results path cited anywhere: the pattern no longer matches the docs"
    assert not missing, "cited result paths that do not exist:\n" + "\n".join(missing)


def test_results_live_in_dated_folders() -> None:
    """benchmarks/results/<date>-<name>/, plus the machine-readable summary h200.json."""
    for entry in (ROOT / "benchmarks" / "results").iterdir():
        if entry.name == "h200.json":
            continue
        assert entry.is_dir() and re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+", entry.name), entry.name


def test_placeholders_become_patterns() -> None:
    cited = cited_paths(
        "see `benchmarks/results/x/chain_bench_SET/bench.json`, and benchmarks/results/y/a_{r1,r2}.json."
    )
    assert cited == ["benchmarks/results/x/chain_bench_SET/bench.json", "benchmarks/results/y/a_{r1,r2}.json"]
    assert [as_glob(p) for p in cited] == [
        "benchmarks/results/x/chain_bench_*/bench.json",
        "benchmarks/results/y/a_*.json",
    ]
