"""Whether this package's Triton kernels can run on a device: the one check that both the drafter's
fused top-k (`engine.top_k_cuda`) and the target runtime's cache attention
(`engine.runners.fast.attention_triton`) are chosen by."""

from __future__ import annotations

import importlib.util

import torch


def triton_kernels_run_on(device: torch.device) -> bool:
    """True on CUDA where Triton is importable (Linux CUDA builds of torch ship it; others may not)."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None
