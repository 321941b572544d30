"""The harness end to end on CPU: a tiny target, an untrained draft, 2 prompts, a few tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.bench.harness import METHODS, BenchConfig, run_benchmark
from eaglewire.errors import ConfigError
from eaglewire.predict.predictor import SummaryPredictor

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tiny_target, draft_dir, two_prompts):  # type: ignore[no-untyped-def]
    cfg = BenchConfig(max_new_tokens=8, chain_steps=3, tree_num_steps=2, tree_topk=2, tree_num_draft_tokens=4,
                      warmup=1, repeats=2)  # fmt: skip
    return run_benchmark(tiny_target, draft_dir, two_prompts, cfg, meta={"command": "test"},
                         predictor=SummaryPredictor((0.5, 0.25, 0.1)))  # fmt: skip


def test_every_method_reported(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    paths = report.write(tmp_path)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert list(data["methods"]) == list(METHODS)
    assert data["reference_method"] == "plain" and data["num_prompts"] == 2
    for name in ("plain", "eagle-chain", "eagle-tree", "hf-generate", "hf-prompt-lookup"):
        m = data["methods"][name]
        assert m["available"], name
        assert m["tokens_per_s"] > 0 and m["new_tokens"] > 0
        assert m["speedup_vs_plain"] > 0 and m["speedup_vs_hf_generate"] > 0
        assert len(m["prompts"]) == 2 and all(len(p["all_seconds"]) == 2 for p in m["prompts"])
    static = data["methods"]["hf-static-compiled"]
    assert not static["available"] and "CUDA" in static["reason"]  # CPU: said, not hidden
    chain, tree = data["methods"]["eagle-chain"], data["methods"]["eagle-tree"]
    assert chain["settings"] == {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    assert len(chain["per_position_acceptance"]) == 3 and len(tree["per_position_acceptance"]) == 2
    for m in (chain, tree):
        assert 1.0 <= m["tau"] <= m["settings"]["num_steps"] + 1
        assert set(m["cycle_fraction"]) == {"draft", "verify", "accept", "host"}
        assert sum(m["cycle_fraction"].values()) == pytest.approx(1.0)
        assert m["phase_seconds"]["verify"] > 0
    assert data["predictions"][0]["predicted_tau"] == pytest.approx(1 + 0.5 + 0.125 + 0.0125)
    assert data["predictions"][1]["predicted_tau"] is None  # tree: a summary has no ranks, said in the note
    assert {p.name for p in paths} >= {
        "bench.json",
        "bench.md",
        "throughput.png",
        "acceptance.png",
        "phases.png",
    }
    for png in ("throughput.png", "acceptance.png", "phases.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC


def test_speculative_greedy_equals_plain(report) -> None:  # type: ignore[no-untyped-def]
    plain = report.results["plain"]
    for name in ("eagle-chain", "eagle-tree"):
        spec = report.results[name]
        assert spec.mismatches == []
        assert [r.token_ids for r in spec.runs] == [r.token_ids for r in plain.runs]
        assert [r.text for r in spec.runs] == [r.text for r in plain.runs]
    assert all(len(r.token_ids) > 0 for r in plain.runs)


def test_markdown_table(report) -> None:  # type: ignore[no-untyped-def]
    md = report.markdown()
    table = md.split("\n\n")[2]  # title, run line, the method table, notes...
    lines = table.splitlines()
    assert lines[0].startswith(
        "| method | setting | tok/s | vs plain | vs HF generate | decode-only tok/s | decode vs plain | "
        "ms/forward | tau |"
    )
    assert [line.split("|")[1].strip() for line in lines[2:]] == list(METHODS)
    assert {line.count("|") for line in lines} == {lines[0].count("|")}  # every row has every column
    # eaglewire's methods time their prefill, so the decode-only columns are filled for them
    plain_row = next(line for line in lines if line.startswith("| plain |")).split("|")
    assert plain_row[6].strip() != "-" and plain_row[7].strip() == "1.00x" and plain_row[8].strip() != "-"
    hf_row = next(line for line in lines if line.startswith("| hf-generate |")).split("|")
    assert hf_row[6].strip() == "-"  # transformers' generate cannot separate its prefill
    assert "| plain | batch_size=1 |" in md and "(reference)" in md
    assert "not available: needs a CUDA/XPU device" in md
    assert "Offline predicted vs measured tau" in md and "Command: `test`" in md


def test_config_errors(tiny_target, two_prompts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="unknown"):
        BenchConfig(methods=("plain", "vllm"))
    with pytest.raises(ConfigError, match="SGLang would silently"):
        BenchConfig(tree_num_steps=3, tree_topk=1, tree_num_draft_tokens=8)
    with pytest.raises(ConfigError, match="need a draft"):
        run_benchmark(tiny_target, None, two_prompts, BenchConfig(methods=("eagle-chain",)))
