"""varying_shape_attention: cuDNN attention is off inside the block, back on after it; results unchanged."""

import torch
import torch.nn.functional as F

from eaglewire.nn.attention import varying_shape_attention


def test_cudnn_attention_off_inside_and_restored_after() -> None:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with varying_shape_attention():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_masked_attention_and_its_gradient_are_unchanged() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[..., 0] = True  # every query sees a key
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    (grad_ref,) = torch.autograd.grad(ref.sum(), q)
    with varying_shape_attention():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        (grad,) = torch.autograd.grad(out.sum(), q)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grad, grad_ref)
