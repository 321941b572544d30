"""benchmarks/engine_speed.py --context-tokens: decode(1) and verify(k) timed with that many tokens in the
KV cache, on the tiny shape on CPU (in-process, one thread: tiny matmuls gain nothing from more)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmarks.engine_speed import context_table, main

from eaglewire.cli.common import EXIT_INVALID_INPUT, run_script

FAST = ["--tiny", "--skip-parity", "--hf-tokens", "0", "--ks", "1,4"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_context_tokens_time_every_width_per_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "speed.json"
    assert main([*FAST, "--context-tokens", "0,200", "--context-ks", "4,16", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["context_tokens"] == [0, 200]
    assert result["meta"]["context_ks"] == [1, 4, 16]  # decode(1) added: every ratio's base
    tiny = result["tiny"]
    assert tiny["max_seq_len"] >= 200 + 16
    by_context = tiny["by_context"]
    assert list(by_context) == ["0", "200"]
    for row in by_context.values():
        assert set(row["forward_ms"]) == {"1", "4", "16"} and all(v > 0 for v in row["forward_ms"].values())
        assert row["verify_over_decode"]["1"] == pytest.approx(1.0)
        assert all(0.0 <= v < 1.0 for v in row["context_share"].values())
        assert "attention_share" not in row  # the profiler's split runs on CUDA only
    assert all(v == 0.0 for v in by_context["0"]["context_share"].values())  # the base context
    table = capsys.readouterr().out
    assert "ms k=16" in table and context_table(result) in table


def test_without_context_tokens_nothing_is_added(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    assert main([*FAST, "--max-seq-len", "256", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert "by_context" not in result["tiny"] and result["tiny"]["max_seq_len"] == 256
    assert result["meta"]["context_tokens"] == []


@pytest.mark.parametrize(
    ("contexts", "said"),
    [
        ("0,-5", "expected tokens >= 0, got [-5]"),
        ("0,4000", "4000 cached tokens + a verify of 128 (--context-ks) = 4128"),
    ],
)
def test_a_bad_context_is_refused_before_any_model(
    contexts: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        run_script(lambda: main([*FAST, "--context-tokens", contexts]))
    assert exit_.value.code == EXIT_INVALID_INPUT == 2
    err = capsys.readouterr().err
    assert "--context-tokens" in err and said in err
    assert "4096 (max_position_embeddings)" in err or "-5" in contexts
