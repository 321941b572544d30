"""A graphed prefill pads one empty row to a power-of-two width: the real tokens' logits and aux,
and every later forward, must equal the eager prefill's. On CPU there are no graphs, so the runner
is told to take the padded route; it then runs the same bounded-window arithmetic eagerly."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.runners.fast.kv_cache import prefill_width
from eaglewire.engine.runners.fast.runner import FastTargetRunner, pad_prefill
from tests.unit.engine.runners.tiny_targets import tiny

ATOL = 1e-4


def test_widths_are_powers_of_two_from_the_minimum() -> None:
    assert [prefill_width(n) for n in (1, 15, 16, 17, 33, 100, 128, 129, 512)] == [
        16, 16, 16, 32, 64, 128, 128, 256, 512,
    ]  # fmt: skip


def test_padding_continues_the_positions() -> None:
    ids, pos = pad_prefill(torch.tensor([[5, 6, 7]]), torch.tensor([[10, 11, 12]]), 6)
    assert ids.tolist() == [[5, 6, 7, 0, 0, 0]] and pos.tolist() == [[10, 11, 12, 13, 14, 15]]


def _runner(target, padded: bool) -> FastTargetRunner:  # type: ignore[no-untyped-def]
    runner = FastTargetRunner(target, (1, target.num_layers), max_batch_size=1, max_seq_len=128)
    if padded:  # what a CUDA runner decides for one empty row
        runner._prefill_graph_width = lambda B, N: prefill_width(N)  # type: ignore[method-assign]
    runner.reset(1)
    return runner


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("at_last", [True, False])
def test_padded_prefill_then_decode_equals_eager(arch: str, at_last: bool) -> None:
    target = tiny(arch)
    n = 21  # padded to 32: 11 padding tokens after the prompt
    ids = torch.randint(0, target.vocab_size, (1, n + 4), generator=torch.Generator().manual_seed(3))
    outs = []
    for padded in (False, True):
        runner = _runner(target, padded)
        at = torch.tensor([n - 1]) if at_last else None
        first = runner.forward(ids[:, :n], torch.arange(n)[None], logits_at=at)
        runner.commit_prefix(torch.tensor([n]))
        steps = []
        for t in range(n, n + 4):  # decode after it: the padding's K/V must be invisible
            steps.append(runner.forward(ids[:, t : t + 1], runner.lengths[:, None]))
            runner.commit(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long))
        outs.append((first, steps))
    (eager, eager_steps), (padded_first, padded_steps) = outs
    assert padded_first.logits.shape == eager.logits.shape == (1, 1 if at_last else n, target.vocab_size)
    assert padded_first.aux.shape == eager.aux.shape == (1, n, 2 * target.hidden_size)
    torch.testing.assert_close(padded_first.logits, eager.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(padded_first.aux, eager.aux, atol=ATOL, rtol=0)
    for a, b in zip(padded_steps, eager_steps, strict=True):
        torch.testing.assert_close(a.logits, b.logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(a.aux, b.aux, atol=ATOL, rtol=0)


def test_a_prefill_wider_than_the_cache_or_the_limit_stays_eager() -> None:
    target = tiny("llama")
    runner = FastTargetRunner(target, (1,), max_batch_size=2, max_seq_len=64)
    assert runner._prefill_graph_width(1, 20) is None  # CPU: no graphs at all
    runner._graphs = object()  # type: ignore[assignment]  # as on CUDA (only the decision is asked)
    assert runner._prefill_graph_width(1, 20) == 32
    assert runner._prefill_graph_width(2, 20) is None  # batched prefills are compute-bound: eager
    assert runner._prefill_graph_width(1, 65) is None  # 128 wide > the cache's 64 slots
    runner.graph_max_prefill_tokens = 16
    assert runner._prefill_graph_width(1, 20) is None


def test_a_failing_graphed_prefill_falls_back_to_eager_for_good(caplog) -> None:  # type: ignore[no-untyped-def]
    target = tiny("llama")
    ids = torch.randint(0, target.vocab_size, (1, 20), generator=torch.Generator().manual_seed(4))
    want = _runner(target, padded=False).forward(ids, torch.arange(20)[None], logits_at=torch.tensor([19]))
    runner = _runner(target, padded=False)
    runner._graphs = object()  # type: ignore[assignment]  # as on CUDA: the padded route is taken

    def failing_replay(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("capture failed")

    runner._replay = failing_replay  # type: ignore[method-assign]
    got = runner.forward(ids, torch.arange(20)[None], logits_at=torch.tensor([19]))
    torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(got.aux, want.aux, atol=ATOL, rtol=0)
    assert "graphed prefill (width 32) failed (capture failed)" in caplog.text
    assert runner._prefill_graph_width(1, 20) is None  # later prefills go straight to eager
