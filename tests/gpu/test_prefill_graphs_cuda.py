"""On CUDA a prefill of one empty row replays a padded CUDA graph: its logits and aux (float32)
equal the eager prefill's, the decode steps after it too, and one graph serves every prompt length
of its width (no capture per prompt).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.runners.fast.runner import FastTargetRunner
from tests.helpers.tiny import make_tiny_target

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ATOL = 1e-3  # float32; the graphed path runs compiled kernels, the eager one does not


def _prefill_then_decode(runner: FastTargetRunner, ids: torch.Tensor, n: int) -> list[torch.Tensor]:
    runner.reset(1)
    first = runner.forward(ids[:, :n], torch.arange(n, device="cuda")[None], logits_at=torch.tensor([n - 1]))
    runner.commit_prefix(torch.tensor([n]))
    outs = [first.logits, first.aux]
    for t in range(n, ids.shape[1]):
        step = runner.forward(ids[:, t : t + 1], runner.lengths[:, None])
        runner.commit(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long))
        outs += [step.logits, step.aux]
    return outs


def test_graphed_prefill_equals_eager_and_reuses_its_graph() -> None:
    target = make_tiny_target("llama", num_layers=4)
    target.model.to("cuda", torch.float32)
    L = target.num_layers
    graphed = FastTargetRunner(target, (1, L), max_batch_size=1, max_seq_len=256, dtype=torch.float32)
    eager = FastTargetRunner(
        target, (1, L), max_batch_size=1, max_seq_len=256, dtype=torch.float32, graph_max_prefill_tokens=0
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (1, 60), generator=gen).cuda()
    for n in (40, 33, 57):  # one 64-wide prefill graph for all three
        for a, b in zip(
            _prefill_then_decode(graphed, ids, n), _prefill_then_decode(eager, ids, n), strict=True
        ):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
        if n == 40:
            captured = graphed.graph_stats[0]
    assert graphed.graph_stats[0] == captured  # later lengths of the same width captured nothing new
