"""The runtime's Triton attention over the KV cache (`runtime.attention_triton`) equals
scaled_dot_product_attention on the grouped queries with the runtime's additive mask: decode
steps, chains and trees up to 128 nodes, one row and a batch, float32 and bf16; and a whole
forward with it equals the SDPA forward.

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eaglewire.engine.runners.fast.model import TRITON_ATTENTION_MAX_ROWS, KernelChoices, prepare
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from tests.helpers.tiny import make_tiny_target
from tests.unit.engine.conftest import AUX_BOUNDARIES, NUM_LAYERS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HKV, G, HD = 3, 3, 64  # SmolLM2's attention: 9 query heads over 3 KV heads of 64


def random_tree_mask(g: torch.Generator, B: int, N: int) -> torch.Tensor:
    """[B, N, N] ancestor masks of random trees (each node's parent an earlier node)."""
    masks = torch.zeros(B, N, N, dtype=torch.bool)
    for b in range(B):
        for i in range(N):
            masks[b, i, i] = True
            if i:
                parent = int(torch.randint(0, i, (1,), generator=g))
                masks[b, i] |= masks[b, parent]
    return masks.cuda()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("B", "N", "committed"), [(1, 1, 200), (1, 6, 300), (1, 16, 130), (1, 128, 310), (4, 1, 90)]
)
def test_cache_attention_equals_sdpa(B: int, N: int, committed: int, dtype: torch.dtype) -> None:
    from eaglewire.engine.runners.fast.attention_triton import cache_attention

    g = torch.Generator().manual_seed(N * 7 + B)
    Smax, S = 1024, ((committed + N + 63) // 64) * 64  # the attended window, in 64-slot buckets
    kv = torch.randn(B + 1, 2 * HKV, Smax, HD, generator=g).to("cuda", dtype)  # a spare cache row
    q = torch.randn(B, HKV * G, N, HD, generator=g).to("cuda", dtype)
    lengths = torch.tensor([committed - 7 * b for b in range(B)], device="cuda")
    positions = lengths[:, None] + torch.arange(N, device="cuda")
    tree = random_tree_mask(g, B, N) if N > 1 else None
    inv_freq = torch.ones(HD // 2, device="cuda")
    *_, mask = prepare(positions, lengths, tree, torch.arange(S, device="cuda"), inv_freq, 1.0, G, dtype)
    assert mask is not None
    got = cache_attention(q, kv, mask)  # [B, N, Hq, hd]
    qg = q.reshape(B, HKV, G * N, HD)
    ref = F.scaled_dot_product_attention(qg, kv[:B, :HKV, :S], kv[:B, HKV:, :S], attn_mask=mask)
    ref = ref.reshape(B, HKV * G, N, HD).transpose(1, 2)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


def test_a_forward_with_triton_attention_equals_the_sdpa_forward() -> None:
    target = make_tiny_target("llama", num_layers=NUM_LAYERS)
    target.model.to("cuda", torch.float32)
    boundaries = AUX_BOUNDARIES
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, target.vocab_size, (1, 40), generator=g).cuda()
    tree = random_tree_mask(g, 1, 12)
    outputs = {}
    choices = {
        "sdpa": KernelChoices(attention="sdpa"),
        "triton": KernelChoices(attention="triton"),  # every forward
        "triton decode": KernelChoices(
            attention="triton", triton_attention_max_rows=TRITON_ATTENTION_MAX_ROWS
        ),
    }
    for attention, kc in choices.items():
        runner = FastTargetRunner(target, boundaries, max_batch_size=1, max_seq_len=256, kernel_choices=kc)
        assert runner.kernel_choices == kc
        runner.forward(ids[:, :28], torch.arange(28, device="cuda")[None])
        runner.commit(torch.arange(28, device="cuda")[None], torch.tensor([28], device="cuda"))
        positions = 28 + tree.sum(-1) - 1  # [1, 12] depth below the root
        forwards = [runner.forward(ids[:, 28:], positions, tree)]
        runner.commit(torch.zeros(1, 1, dtype=torch.long, device="cuda"), torch.tensor([1], device="cuda"))
        for t in range(29, 32):  # then decode steps, each kept
            forwards.append(runner.forward(ids[:, t : t + 1], torch.tensor([[t]], device="cuda")))
            runner.commit_prefix(torch.tensor([1], device="cuda"))
        outputs[attention] = forwards
    for attention in ("triton", "triton decode"):
        for got, want in zip(outputs[attention], outputs["sdpa"], strict=True):
            torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got.aux, want.aux, rtol=1e-4, atol=1e-4)
