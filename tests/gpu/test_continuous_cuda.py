"""On CUDA (graphs, compiled layers, padded rows), continuous batching gives every prompt the same
greedy tokens as batch-by-batch plain decoding (float32).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.plain import generate_plain_with_stats
from eaglewire.engine.runners.factory import make_runner
from tests.helpers.tiny import make_tiny_target

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_continuous_equals_batched_on_cuda_graphs() -> None:
    target = make_tiny_target("llama", num_layers=2)
    target.model.to("cuda")
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 384, (int(n),), generator=g).tolist()
        for n in torch.randint(2, 40, (37,), generator=g)
    ]
    runner = make_runner(target, (), max_batch_size=16, max_seq_len=128)
    assert getattr(runner, "use_graphs", False)
    free = generate_plain_with_stats(runner, prompts, 24, eos_token_ids=())
    counts = torch.bincount(torch.tensor([t for row in free.tokens for t in row[1:]]))
    eos = tuple(counts.topk(2).indices.tolist())  # frequent tokens end answers early: rows get refilled
    batched = generate_plain_with_stats(runner, prompts, 24, eos_token_ids=eos)
    streamed = generate_plain_with_stats(runner, prompts, 24, eos_token_ids=eos, continuous=True)
    assert streamed.tokens == batched.tokens
    assert any(len(t) < 24 for t in streamed.tokens)
