"""Plain decoding with batches padded to graph-friendly row counts: the padding rows change nothing,
and regeneration / Magpie size a reused runner once (`reserve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from eaglewire.data.formats import Conversation, Message
from eaglewire.data.generation import SamplingConfig
from eaglewire.data.magpie import generate_magpie_prompts
from eaglewire.data.regenerate import regenerate
from eaglewire.engine.plain import (
    GRAPH_ROW_STEP,
    generate_plain_with_stats,
    padded_rows,
)
from eaglewire.engine.reused_runner import ReusedRunnerGenerate
from eaglewire.engine.runners.factory import make_runner
from eaglewire.errors import ConfigError
from tests.helpers.tiny import make_tiny_target

# two length buckets (PAD_RATIO 2): 10 rows of 10..19 tokens, then 3 rows of 2..4 tokens
LENGTHS = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 2, 3, 4]


def _prompts(seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 384, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.mark.parametrize(
    ("n", "max_rows", "expected"),
    [
        (1, 256, 1),
        (2, 256, 2),
        (3, 256, 4),
        (5, 256, 8),
        (8, 256, 8),
        (9, 256, GRAPH_ROW_STEP),
        (64, 256, 64),
        (65, 256, 128),
        (113, 256, 128),
        (193, 256, 256),
        (256, 256, 256),
        (70, 100, 100),  # capped at the runner's rows
        (3, 3, 3),
        (9, 12, 12),
    ],
)
def test_padded_rows(n: int, max_rows: int, expected: int) -> None:
    assert padded_rows(n, max_rows) == expected


def test_padded_rows_rejects_impossible_batches() -> None:
    with pytest.raises(ConfigError, match="n=0"):
        padded_rows(0, 8)
    with pytest.raises(ConfigError, match="max_rows=8"):
        padded_rows(9, 8)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_padding_changes_no_row(temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    target = make_tiny_target("llama", num_layers=2)
    runner = make_runner(target, (), max_batch_size=70, max_seq_len=64)
    assert not getattr(runner, "use_graphs", False)  # CPU: no graphs, so no padding unless forced
    sizes: list[int] = []
    real_reset = runner.reset

    def recording_reset(batch_size: int) -> None:
        sizes.append(batch_size)
        real_reset(batch_size)

    monkeypatch.setattr(runner, "reset", recording_reset)
    prompts = _prompts()
    kw: dict[str, Any] = {"temperature": temperature, "top_p": 0.9, "seed": 3, "eos_token_ids": ()}
    plain = generate_plain_with_stats(runner, prompts, 9, **kw)
    assert sizes == [10, 3]
    sizes.clear()
    padded = generate_plain_with_stats(runner, prompts, 9, pad_rows=True, **kw)
    assert sizes == [64, 4]
    assert padded.tokens == plain.tokens
    assert (padded.prompt_tokens, padded.new_tokens, padded.forwards) == (sum(LENGTHS), 9 * 13, 2 * 8)
    assert (padded.prompt_tokens, padded.new_tokens, padded.forwards) == (
        plain.prompt_tokens,
        plain.new_tokens,
        plain.forwards,
    )
    assert (padded.graphs_captured, padded.graph_capture_seconds) == (0, 0.0)


def test_padding_rows_do_not_delay_the_early_stop() -> None:
    """Every real row stops at its first token; the dummy rows (never done) must not keep it going."""
    target = make_tiny_target("llama", num_layers=2)
    runner = make_runner(target, (), max_batch_size=8, max_seq_len=64)
    prompts = _prompts()[10:]  # 3 rows -> padded to 4
    every_id = list(range(runner.vocab_size))
    plain = generate_plain_with_stats(runner, prompts, 40, eos_token_ids=every_id, check_every=4)
    padded = generate_plain_with_stats(
        runner, prompts, 40, eos_token_ids=every_id, check_every=4, pad_rows=True
    )
    assert padded.tokens == plain.tokens and all(len(t) == 1 for t in padded.tokens)
    assert padded.forwards == plain.forwards == 3  # stopped at the first check, not after 40 steps


def test_reserve_sizes_the_runner_once() -> None:
    target = make_tiny_target("llama", num_layers=2)
    prompts = _prompts()
    gen = ReusedRunnerGenerate(max_batch_size=8)
    gen.reserve(32, 300)  # rows capped at max_batch_size
    assert (gen.reserved_rows, gen.reserved_seq_len) == (8, 300)
    short = gen(target, prompts[10:], 4, eos_token_ids=())
    runner = gen.runner
    assert runner.max_batch_size == 8 and runner.max_seq_len == 512  # 300 rounded up to 256-steps
    gen(target, prompts[:10], 4, eos_token_ids=())  # more rows, longer prompts: still fits
    assert gen.runner is runner
    assert gen(target, prompts[10:], 4, eos_token_ids=()) == short
    with pytest.raises(ConfigError, match="max_seq_len=0"):
        gen.reserve(4, 0)


class _RecordingGenerate:
    """A generate function with `reserve`, answering nothing (each answer is cut at length)."""

    def __init__(self) -> None:
        self.reserved: list[tuple[int, int]] = []

    def reserve(self, max_batch_size: int, max_seq_len: int) -> None:
        self.reserved.append((max_batch_size, max_seq_len))

    def __call__(self, target: Any, prompts: list[list[int]], *args: Any) -> list[list[int]]:
        return [[] for _ in prompts]


def test_regenerate_reserves_when_the_prompt_bound_is_known(tmp_path: Path) -> None:
    target = make_tiny_target("llama", num_layers=2)
    convs = [Conversation("a", (Message("user", "hello"),)), Conversation("b", (Message("user", "hi"),))]
    cfg = SamplingConfig(max_new_tokens=7, temperature=0.0, top_p=1.0, seed=0, batch_size=2)
    fn = _RecordingGenerate()
    regenerate(target, convs, tmp_path / "a.jsonl", cfg, show_progress=False, generate_fn=fn)
    assert fn.reserved == []  # no max_prompt_tokens: nothing to reserve
    regenerate(
        target, convs, tmp_path / "b.jsonl", cfg, max_prompt_tokens=100, show_progress=False, generate_fn=fn
    )
    assert fn.reserved == [(2, 107)]


def test_magpie_reserves_prefix_plus_new_tokens() -> None:
    target = make_tiny_target("llama", num_layers=2)
    cfg = SamplingConfig(max_new_tokens=5, temperature=1.0, top_p=1.0, seed=0, batch_size=4)
    fn = _RecordingGenerate()
    assert generate_magpie_prompts(target, 2, sampling=cfg, show_progress=False, generate_fn=fn) == []
    assert len(fn.reserved) == 1
    rows, seq_len = fn.reserved[0]
    assert rows == 4 and 5 < seq_len < 5 + 64
