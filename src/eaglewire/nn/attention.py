"""Which fused attention kernels run where attention shapes change from call to call.

On Hopper GPUs PyTorch may pick cuDNN's fused attention. cuDNN builds an execution plan for each
new input shape on the host and caches it: free where shapes repeat (decoding, replayed from CUDA
graphs) but ruinous where nearly every call brings a new shape: training batches are packed to
their own length, prefills and captures run each prompt's length. On an H200 (benchmarks/
train_profile.py) one 16 x 1024-token training step spent 177 ms of host time in cuDNN
attention forwards (and a 32-row step 585 ms in 7 backwards) against 107 ms of GPU kernels for
the whole step; the GPU sat idle. Flash and memory-efficient attention have no such plans.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from torch.nn.attention import SDPBackend, sdpa_kernel

# Priority order; math is the fallback every input supports.
VARYING_SHAPE_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def varying_shape_attention() -> AbstractContextManager[None]:
    """`F.scaled_dot_product_attention` without cuDNN inside the block (backwards follow the
    forward's choice): for code whose attention shapes vary from call to call."""
    return sdpa_kernel(list(VARYING_SHAPE_BACKENDS))
