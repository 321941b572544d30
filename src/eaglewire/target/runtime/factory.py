"""Choose the target runner: the fast compact model when the architecture allows, else generic."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from eaglewire.errors import UnsupportedArchitectureError
from eaglewire.target.loading import LoadedTarget
from eaglewire.target.runtime.generic import GenericTargetRunner
from eaglewire.target.runtime.runner import FastTargetRunner
from eaglewire.target.runtime.weights import check_fast_supported

log = logging.getLogger(__name__)


def make_target_runner(
    target: LoadedTarget,
    aux_boundaries: Sequence[int],
    max_batch_size: int,
    max_seq_len: int,
    prefer_fast: bool = True,
    dtype: torch.dtype | None = None,
) -> FastTargetRunner | GenericTargetRunner:
    """FastTargetRunner for Llama-family targets (when `prefer_fast`), GenericTargetRunner otherwise
    (any supported architecture; no KV cache, recomputes every forward)."""
    if prefer_fast:
        try:
            check_fast_supported(target.config, max_seq_len)
        except UnsupportedArchitectureError as err:
            log.info("fast target runtime unavailable (%s); using the generic transformers runner", err)
        else:
            return FastTargetRunner(
                target, aux_boundaries, max_batch_size=max_batch_size, max_seq_len=max_seq_len, dtype=dtype
            )
    return GenericTargetRunner(
        target, aux_boundaries, max_batch_size=max_batch_size, max_seq_len=max_seq_len, dtype=dtype
    )
