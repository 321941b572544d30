"""benchmarks/served_overhead.py's settings: what each runs in-process and serves (the end-to-end run is
`python benchmarks/served_overhead.py --tiny`, minutes on 2 cores, so it is left to the GPU session)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[3] / "benchmarks" / "served_overhead.py"
_spec = importlib.util.spec_from_file_location("served_overhead", _path)
assert _spec is not None and _spec.loader is not None
served_overhead = importlib.util.module_from_spec(_spec)
sys.modules["served_overhead"] = served_overhead
_spec.loader.exec_module(served_overhead)
Setting = served_overhead.Setting


def test_settings_map_to_the_same_spec_in_process_and_served() -> None:
    chain, tree, plain = Setting.parse("chain:5"), Setting.parse("tree:8x12x128"), Setting.parse("plain")
    assert (chain.num_steps, chain.topk, chain.num_draft_tokens, chain.method) == (5, 1, 6, "eagle-chain")
    assert chain.bench_flags() == ["--methods", "eagle-chain", "--chain-steps", "5"]
    assert chain.serve_flags() == ["--num-steps", "5", "--topk", "1", "--num-draft-tokens", "6"]
    assert tree.method == "eagle-tree" and tree.serve_flags()[1::2] == ["8", "12", "128"]
    assert tree.bench_flags()[:2] == ["--methods", "eagle-tree"] and tree.bench_flags()[3::2] == [
        "8",
        "12",
        "128",
    ]
    assert (
        plain.method == "plain"
        and plain.serve_flags() == []
        and plain.bench_flags() == ["--methods", "plain"]
    )


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(SystemExit, match="chain:K or tree:SxKxN"):
        Setting.parse("beam:4")
