"""Plain decoding: batched prompts of different lengths == one at a time == transformers greedy."""

from __future__ import annotations

import pytest
import torch

import eaglewire.engine.plain as plain
from eaglewire.engine.plain import generate_plain, generate_plain_with_stats
from eaglewire.engine.plain_parts import sample_next
from eaglewire.engine.runners.factory import make_runner
from eaglewire.errors import ConfigError
from tests.unit.engine.runners.tiny_targets import tiny

LENGTHS = [5, 17, 9, 30, 1, 12]


def _prompts(seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 384, (n,), generator=g).tolist() for n in LENGTHS]


def test_batched_greedy_equals_batch_one_and_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    target = tiny("qwen2")
    prompts = _prompts()
    runner = make_runner(target, (), max_batch_size=8, max_seq_len=64)
    batched = generate_plain_with_stats(runner, prompts, 12, eos_token_ids=())
    assert [len(t) for t in batched.tokens] == [12] * len(prompts)
    assert batched.new_tokens == 12 * len(prompts) and batched.tokens_per_s > 0
    single = [generate_plain(runner, [p], 12, eos_token_ids=())[0] for p in prompts]
    assert batched.tokens == single
    for p, got in zip(prompts, batched.tokens, strict=True):
        hf = target.model.generate(
            torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        assert hf[0, len(p) :].tolist() == got
    # chunked prefill (small token budget) and the recompute runner give the same tokens
    monkeypatch.setattr(plain, "PREFILL_TOKEN_BUDGET", 40)
    assert generate_plain(runner, prompts, 12, eos_token_ids=()) == batched.tokens
    recompute = make_runner(target, (), "hf", max_batch_size=8, max_seq_len=64)
    assert generate_plain(recompute, prompts, 12, eos_token_ids=()) == batched.tokens


def test_eos_stops_a_row_and_is_kept() -> None:
    target = tiny("llama")
    prompts = _prompts(2)[:3]
    free = generate_plain(target, prompts, 10, eos_token_ids=())
    stop = free[1][3]
    first = free[1].index(stop)
    out = generate_plain(target, prompts, 10, eos_token_ids=[stop])
    assert out[1] == free[1][: first + 1]
    for row, full in zip(out, free, strict=True):
        assert row == full[: full.index(stop) + 1] if stop in full else row == full
    assert generate_plain(target, prompts, 10) == generate_plain(target, prompts, 10, eos_token_ids=[2])


def test_small_runner_batches_are_split_and_limits_checked() -> None:
    target = tiny("llama")
    prompts = _prompts(3)
    runner = make_runner(target, (), max_batch_size=2, max_seq_len=48)
    assert generate_plain(runner, prompts, 6, eos_token_ids=()) == generate_plain(
        target, prompts, 6, eos_token_ids=()
    )
    with pytest.raises(ConfigError, match="max_seq_len"):
        generate_plain(runner, prompts, 40, eos_token_ids=())
    with pytest.raises(ConfigError, match="empty"):
        generate_plain(runner, [[]], 4)


def test_sampling_is_seeded_and_respects_top_p() -> None:
    target = tiny("llama")
    prompts = _prompts(4)[:2]
    a = generate_plain(target, prompts, 8, temperature=1.0, top_p=0.9, seed=7, eos_token_ids=())
    b = generate_plain(target, prompts, 8, temperature=1.0, top_p=0.9, seed=7, eos_token_ids=())
    c = generate_plain(target, prompts, 8, temperature=1.0, top_p=0.9, seed=8, eos_token_ids=())
    assert a == b and a != c
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(4000, 4)
    gen = torch.Generator().manual_seed(0)
    drawn = sample_next(logits, 1.0, 0.7, gen)
    counts = torch.bincount(drawn, minlength=4).float() / 4000
    assert counts[2] == 0 and counts[3] == 0  # outside the 0.7 nucleus {0.5, 0.3}
    assert abs(counts[0].item() - 0.5 / 0.8) < 0.03
    assert torch.equal(sample_next(logits[:2], 0.0, 1.0, None), torch.tensor([0, 0]))


def test_length_buckets_keep_outliers_apart():
    from eaglewire.engine.plain import length_buckets

    lengths = [1700, 40, 38, 35, 30, 12, 10]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    assert length_buckets(order, lengths, max_rows=60) == [[0], [1, 2, 3, 4], [5, 6]]
    assert length_buckets(order, lengths, max_rows=2) == [[0], [1, 2], [3, 4], [5, 6]]


def test_reused_runner_is_kept_until_a_call_needs_more() -> None:
    from eaglewire.engine.reused_runner import ReusedRunnerGenerate

    target = tiny("llama")
    prompts = _prompts()
    gen = ReusedRunnerGenerate(max_batch_size=4)
    first = gen(target, prompts[:3], 6, eos_token_ids=())
    runner = gen.runner
    assert runner.max_batch_size == 3 and runner.max_seq_len >= max(LENGTHS[:3]) + 6
    assert gen(target, prompts[:2], 6, eos_token_ids=()) == first[:2]
    assert gen.runner is runner  # fewer rows, same length budget: reused
    everything = gen(target, prompts, 6, eos_token_ids=())  # 6 prompts, 4 rows at a time: rebuilt wider
    assert gen.runner is not runner and gen.runner.max_batch_size == 4
    assert everything == generate_plain(target, prompts, 6, eos_token_ids=())
