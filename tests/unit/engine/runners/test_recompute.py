"""RecomputeRunner (transformers, no cache) agrees with the fast runner and with plain HF."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.runners.recompute import RecomputeRunner
from eaglewire.errors import ConfigError
from tests.unit.engine.runners.tiny_targets import tiny

ATOL = 1e-4
TREE = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)


def _script(
    runner: FastTargetRunner | RecomputeRunner, ids: torch.Tensor, new: torch.Tensor
) -> list[torch.Tensor]:
    """prefill (rows of 12 and 10 tokens), a 4-node tree verify, commit, one decode step."""
    runner.reset(2)
    outs = [runner.forward(ids, torch.arange(12).expand(2, 12))]
    runner.commit_prefix(torch.tensor([12, 10]))
    pos = runner.lengths.cpu()[:, None] + torch.tensor([0, 1, 1, 2])[None]
    outs.append(runner.forward(new, pos, TREE.expand(2, 4, 4)))
    runner.commit(torch.tensor([[0, 1, 3], [0, 2, 0]]), torch.tensor([3, 2]))
    outs.append(runner.forward(torch.tensor([[5], [6]]), runner.lengths[:, None]))
    return [t for o in outs for t in (o.logits, o.aux)]


def test_recompute_matches_fast_runner() -> None:
    target = tiny("llama")
    L = target.num_layers
    g = torch.Generator().manual_seed(5)
    ids, new = torch.randint(0, 384, (2, 12), generator=g), torch.randint(0, 384, (2, 4), generator=g)
    fast = _script(FastTargetRunner(target, (1, L), max_batch_size=2, max_seq_len=32), ids, new)
    slow = _script(RecomputeRunner(target, (1, L), max_batch_size=2, max_seq_len=32), ids, new)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_factory_routes_deepseek_to_recompute_and_it_matches_hf() -> None:
    target = tiny("deepseek_v3", 2)
    runner = make_runner(target, (1, 2), max_batch_size=2, max_seq_len=32)
    assert isinstance(runner, RecomputeRunner)
    assert isinstance(make_runner(tiny("qwen3"), (1,), max_batch_size=1, max_seq_len=8), FastTargetRunner)
    g = torch.Generator().manual_seed(6)
    ids, new = torch.randint(0, 384, (2, 12), generator=g), torch.randint(0, 384, (2, 4), generator=g)
    last = _script(runner, ids, new)[-2][:, 0]  # logits of the final decode step
    for b, seq in enumerate(
        [
            torch.cat([ids[0], new[0, [0, 1, 3]], torch.tensor([5])]),
            torch.cat([ids[1, :10], new[1, [0, 2]], torch.tensor([6])]),
        ]
    ):
        ref = target.model(seq[None]).logits[0, -1]
        torch.testing.assert_close(last[b], ref, atol=ATOL, rtol=0)
    assert runner.lengths.tolist() == [15, 12]  # the last decode step is not committed


def test_factory_kinds_and_recompute_limits() -> None:
    """'hf' always recomputes, within the length asked for (else the model's positions); misuse is a
    ConfigError that says the fix."""
    target = tiny("llama")
    assert isinstance(make_runner(target, (1,), "auto", max_seq_len=32), FastTargetRunner)
    runner = make_runner(target, (1,), "hf", max_seq_len=16)
    assert isinstance(runner, RecomputeRunner) and runner.max_seq_len == 16
    positions = target.config.max_position_embeddings
    assert make_runner(target, (1,), "hf").max_seq_len == positions
    with pytest.raises(ConfigError, match="expected auto, fast or hf"):
        make_runner(target, (1,), "gguf")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fix: build the runner with a larger max_batch_size"):
        runner.reset(2)
    runner.reset(1)
    with pytest.raises(ConfigError, match="sequence full"):
        runner.forward(torch.zeros(1, 17, dtype=torch.long), torch.arange(17)[None])
    with pytest.raises(ConfigError, match="fix: load the target in the dtype you want"):
        RecomputeRunner(target, (1,), dtype=torch.float16)
