"""The drafter's Triton top-k (`engine.top_k_cuda`) equals a stable descending sort of the
log-softmax: ids exactly (bf16 logits tie often; equal values go by lower id), log-probabilities
to float32 rounding; inside a compiled function and a CUDA graph too.

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.beam import top_k_log_probs_for

fused = top_k_log_probs_for(torch.device("cuda"), fused=True) if torch.cuda.is_available() else None

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    order = torch.sort(logp, dim=-1, descending=True, stable=True)
    return order.indices[:, :k], order.values[:, :k]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 8, 12, 16])
@pytest.mark.parametrize("shape", [(1, 16384), (12, 16384), (8, 49152), (3, 1000), (4, 64)])
def test_fused_top_k_equals_a_stable_sort(shape: tuple[int, int], k: int, dtype: torch.dtype) -> None:
    g = torch.Generator(device="cuda").manual_seed(k * 1000 + shape[1])
    logits = (torch.randn(shape, generator=g, device="cuda") * 3).to(dtype)
    ids, logp = fused(logits, k)
    ref_ids, ref_logp = reference(logits, k)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=2e-5)


def test_fused_top_k_compiles_and_replays_in_a_graph() -> None:
    logits = torch.randn(8, 16384, device="cuda").bfloat16()
    fn = torch.compile(lambda x: fused(x, 8), dynamic=True, fullgraph=True)
    fn(logits)
    static = logits.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_ids, out_logp = fn(static)
    fresh = torch.randn(8, 16384, device="cuda").bfloat16()
    static.copy_(fresh)
    graph.replay()
    ref_ids, ref_logp = reference(fresh, 8)
    assert torch.equal(out_ids, ref_ids)
    torch.testing.assert_close(out_logp, ref_logp, rtol=0, atol=2e-5)
