"""Continuous batching: a finished row takes the next prompt, and every prompt's greedy tokens are
what batch-by-batch plain decoding gives, however the prompts share the rows."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.continuous import prefill_groups, supports_continuous
from eaglewire.engine.plain import generate_plain_with_stats
from eaglewire.engine.plain_parts import PREFILL_TOKEN_BUDGET
from eaglewire.engine.runners.factory import make_runner
from eaglewire.errors import ConfigError
from tests.helpers.tiny import make_tiny_target


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 20, (n,), generator=g).tolist()
    return [torch.randint(3, 384, (k,), generator=g).tolist() for k in lengths]


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    return make_tiny_target("llama", num_layers=2)


@pytest.mark.parametrize(("rows", "with_eos"), [(4, False), (4, True), (3, True), (16, True)])
def test_continuous_greedy_equals_batched(target, rows: int, with_eos: bool) -> None:  # type: ignore[no-untyped-def]
    prompts = _prompts(11)
    runner = make_runner(target, (), max_batch_size=rows, max_seq_len=64)
    assert supports_continuous(runner)
    eos: tuple[int, ...] = ()
    if with_eos:  # the tokens the tiny model emits most often end answers early
        free = generate_plain_with_stats(runner, prompts, 12, eos_token_ids=())
        counts = torch.bincount(torch.tensor([t for row in free.tokens for t in row[1:]]))
        eos = tuple(counts.topk(2).indices.tolist())
    batched = generate_plain_with_stats(runner, prompts, 12, eos_token_ids=eos)
    streamed = generate_plain_with_stats(runner, prompts, 12, eos_token_ids=eos, continuous=True)
    assert streamed.tokens == batched.tokens
    assert streamed.new_tokens == batched.new_tokens and streamed.prompt_tokens == batched.prompt_tokens
    if eos:  # some answers end early, so rows are refilled while others are still decoding
        assert any(len(t) < 12 for t in streamed.tokens)


def test_continuous_sampling_keeps_lengths_and_eos_rule(target) -> None:  # type: ignore[no-untyped-def]
    prompts = _prompts(9, seed=1)
    runner = make_runner(target, (), max_batch_size=4, max_seq_len=64)
    out = generate_plain_with_stats(runner, prompts, 10, temperature=1.0, eos_token_ids=(7,), continuous=True)
    for tokens in out.tokens:
        assert 1 <= len(tokens) <= 10
        assert 7 not in tokens[:-1]  # generation stops at the first eos, which is kept
        assert len(tokens) == 10 or tokens[-1] == 7


def test_row_subset_prefill_refuses_rows_in_use(target) -> None:  # type: ignore[no-untyped-def]
    runner = make_runner(target, (), max_batch_size=2, max_seq_len=32)
    runner.reset(2)
    ids = torch.tensor([[5, 6, 7]])
    pos = torch.arange(3)[None]
    runner.prefill_rows([1], ids, pos, torch.tensor([2]))
    runner.commit_rows([1], [3])
    with pytest.raises(ConfigError, match="not all empty"):
        runner.prefill_rows([1], ids, pos, torch.tensor([2]))
    with pytest.raises(ConfigError, match="rows"):
        runner.reset_rows([2])
    runner.reset_rows([1])
    assert runner.lengths.tolist() == [0, 0]


def testprefill_groups_fit_the_budget() -> None:
    long, short = [1] * (PREFILL_TOKEN_BUDGET // 2), [1] * 10
    groups = prefill_groups([0, 1, 2, 3], [short, long, long, short])
    assert [g[0] for g in groups] == [[1, 2], [0, 3]]  # longest first; 2 x half the budget fit
    assert all(len(g[0]) * len(g[1][0]) <= PREFILL_TOKEN_BUDGET for g in groups)


def test_regeneration_with_continuous_batching_writes_the_same_answers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from eaglewire.data.formats import Conversation, Message
    from eaglewire.data.generation import SamplingConfig, pick_generate_fn
    from eaglewire.data.regenerate import regenerate

    target = make_tiny_target("llama", num_layers=2)
    words = ["hello there", "what is rain", "tell me a story about a cat", "hi", "why", "count to ten"]
    convs = [
        Conversation(f"c{i}", (Message("user", w), Message("assistant", "x"), Message("user", w[::-1])))
        for i, w in enumerate(words)
    ]
    cfg = SamplingConfig(max_new_tokens=9, temperature=0.0, top_p=1.0, seed=0, batch_size=4)
    answers = {}
    # (continuous, max_rows): max_rows 2 runs the batches of 4 two rows at a time (regen_rows)
    for continuous, max_rows in ((False, 0), (True, 0), (True, 2), (False, 2)):
        out = tmp_path / f"{continuous}_{max_rows}.jsonl"
        fn = pick_generate_fn(continuous=continuous, max_rows=max_rows)
        regenerate(target, convs, out, cfg, max_prompt_tokens=200, show_progress=False, generate_fn=fn)
        answers[continuous, max_rows] = [
            json.loads(line)["messages"] for line in out.read_text().splitlines()
        ]
        assert fn.runner.max_batch_size == (max_rows or cfg.batch_size)  # type: ignore[attr-defined]
    assert answers[True, 0] == answers[False, 0] == answers[True, 2] == answers[False, 2]
    assert all(len(m) == 4 for m in answers[True, 0])  # both user turns answered
    with pytest.raises(ConfigError, match="max_rows"):
        pick_generate_fn(max_rows=-1)


def test_refill_beside_a_long_row_needs_room_for_its_own_tokens_only(target) -> None:  # type: ignore[no-untyped-def]
    runner = make_runner(target, (), max_batch_size=2, max_seq_len=64)
    runner.reset(2)
    long = torch.randint(3, 300, (1, 60))
    runner.prefill_rows([0], long, torch.arange(60)[None], torch.tensor([59]))
    runner.commit_rows([0], [60])
    short = torch.randint(3, 300, (1, 30))
    out = runner.prefill_rows([1], short, torch.arange(30)[None], torch.tensor([29]))  # 60 + 30 > 64: fine
    assert out.logits.shape[:2] == (1, 1)
    with pytest.raises(ConfigError, match="do not fit"):
        runner.prefill_rows([1], torch.randint(3, 300, (1, 65)), torch.arange(65)[None], torch.tensor([64]))
