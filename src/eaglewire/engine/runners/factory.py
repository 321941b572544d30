"""Choose the target runner: the one place that does (`make_runner`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import torch

from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.runners.fast.weights import check_fast_supported
from eaglewire.engine.runners.recompute import RecomputeRunner
from eaglewire.errors import ConfigError, UnsupportedArchitectureError
from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

RunnerKind = Literal["auto", "fast", "hf"]
RUNNER_KINDS: tuple[RunnerKind, ...] = ("auto", "fast", "hf")
DEFAULT_MAX_SEQ_LEN = 4096


def make_runner(
    target: LoadedTarget,
    aux_boundaries: Sequence[int],
    kind: RunnerKind = "auto",
    *,
    max_batch_size: int = 1,
    max_seq_len: int | None = None,
    dtype: torch.dtype | None = None,
) -> FastTargetRunner | RecomputeRunner:
    """A runner of `target` capturing `aux_boundaries` for up to `max_batch_size` sequences.

    'auto' and 'fast': the fast runtime where the architecture and length allow (Llama family),
    else the recompute runner (logged); 'hf': the recompute runner. max_seq_len (prompt + generated
    + one tree) defaults to min(max_position_embeddings, 4096) for the fast runtime's cache; the
    recompute runner, which has no cache, defaults to max_position_embeddings."""
    if kind not in RUNNER_KINDS:
        raise ConfigError(f"runner: expected auto, fast or hf, got {kind!r}", fix="--runner auto")
    bounds = list(aux_boundaries)
    if kind != "hf":
        fast_len = max_seq_len
        if fast_len is None:
            positions = getattr(target.config, "max_position_embeddings", DEFAULT_MAX_SEQ_LEN)
            fast_len = min(int(positions), DEFAULT_MAX_SEQ_LEN)
        try:
            check_fast_supported(target.config, fast_len)
        except UnsupportedArchitectureError as err:
            log.info("fast target runtime unavailable (%s); using the recompute runner", err)
            max_seq_len = fast_len
        else:
            return FastTargetRunner(
                target, bounds, max_batch_size=max_batch_size, max_seq_len=fast_len, dtype=dtype
            )
    return RecomputeRunner(
        target, bounds, max_batch_size=max_batch_size, max_seq_len=max_seq_len, dtype=dtype
    )
