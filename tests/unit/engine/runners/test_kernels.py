"""The optional fused-reduction kernel forms, and per-runner compiled-code isolation (the phase
timers' tests are in tests/unit/engine/test_timers.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eaglewire.engine.runners.fast.graphs import own_code
from eaglewire.engine.runners.fast.model import KernelChoices, attention_reduce, linear


def test_reduction_forms_equal_the_library_ops() -> None:
    g = torch.Generator().manual_seed(0)
    x, w, b = (
        torch.randn(2, 3, 16, generator=g),
        torch.randn(24, 16, generator=g),
        torch.randn(24, generator=g),
    )
    on = KernelChoices(reduction_matmul_max_rows=8, reduction_matmul_max_bytes=1 << 20)
    torch.testing.assert_close(linear(x, w, b, on), F.linear(x, w, b), atol=1e-5, rtol=0)
    torch.testing.assert_close(linear(x, w, None, KernelChoices()), F.linear(x, w))
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    mask = torch.zeros(1, 1, 6, 6).masked_fill(torch.rand(6, 6, generator=g) < 0.4, float("-inf"))
    mask.diagonal(dim1=-2, dim2=-1).zero_()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(attention_reduce(q, k, v, mask), ref, atol=1e-5, rtol=0)


def test_own_code_copies_behave_like_the_original_with_a_distinct_code_object() -> None:
    def f(a: int, b: int = 2) -> int:
        return a * b

    g = own_code(f)
    assert g(3) == 6 and g(3, b=4) == 12 and g.__code__ is not f.__code__


def test_auto_attention_is_triton_for_decode_sized_forwards_on_cuda_and_sdpa_elsewhere(monkeypatch) -> None:
    import importlib.util

    from eaglewire.engine.runners.fast.model import TRITON_ATTENTION_MAX_ROWS

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: object() if name == "triton" else real_find_spec(name)
    )
    on_cuda = KernelChoices().resolved(torch.device("cuda"))  # as where Triton is installed
    assert (on_cuda.attention, on_cuda.triton_attention_max_rows) == ("triton", TRITON_ATTENTION_MAX_ROWS)
    assert KernelChoices().resolved(torch.device("cpu")).attention == "sdpa"
    chosen = KernelChoices(attention="sdpa")
    assert chosen.resolved(torch.device("cuda")) == chosen  # an explicit choice is kept
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "triton" else real_find_spec(name)
    )
    assert KernelChoices().resolved(torch.device("cuda")).attention == "sdpa"  # a CUDA build without Triton
