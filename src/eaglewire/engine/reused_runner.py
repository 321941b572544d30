"""One plain-generation runner reused across many calls (data regeneration, Magpie prompts).

`ReusedRunnerGenerate` has the signature of `eaglewire.data.generation.GenerateFn`; it keeps its
runner (compiled code, captured CUDA graphs, KV cache) from call to call and rebuilds it only when a
call needs more rows or a longer sequence.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from eaglewire.engine.plain import DEFAULT_MAX_BATCH, generate_plain, padded_rows
from eaglewire.engine.runners.factory import make_runner
from eaglewire.errors import ConfigError
from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

RUNNER_LENGTH_STEP = 256  # a reused runner's max_seq_len grows in these steps


class ReusedRunnerGenerate:
    """`generate_plain` over one runner kept across calls, rebuilt only when a call needs more rows or
    a longer sequence than the current one holds (lengths rounded up to RUNNER_LENGTH_STEP; on a CUDA
    target, rows rounded up to `padded_rows`, the sizes its batches run with).

    Regeneration calls generation once per batch and turn: with a fresh runner each time, CUDA graphs
    and compiled code were built again for every batch (and their memory pools piled up). A caller
    that knows its largest batch and sequence up front calls `reserve` first, so the runner is built
    once, at that size, by the first call (a rebuild recompiles and recaptures everything)."""

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH, *, continuous: bool = False) -> None:
        self.max_batch_size = max_batch_size
        self.continuous = continuous  # refill finished rows (`eaglewire.engine.continuous`)
        self.runner: Any = None
        self.reserved_rows = 0
        self.reserved_seq_len = 0

    def reserve(self, max_batch_size: int, max_seq_len: int) -> None:
        """Size the runner the next call builds for batches of up to `max_batch_size` prompts (capped
        at this object's max_batch_size, the most rows a forward runs) and prompt + new tokens of up
        to `max_seq_len`; calls that need more still rebuild it."""
        if max_batch_size < 1 or max_seq_len < 1:
            raise ConfigError(
                f"ReusedRunnerGenerate.reserve: max_batch_size={max_batch_size} and "
                f"max_seq_len={max_seq_len} must be >= 1"
            )
        self.reserved_rows = max(self.reserved_rows, min(max_batch_size, self.max_batch_size))
        self.reserved_seq_len = max(self.reserved_seq_len, max_seq_len)

    def __call__(
        self,
        target: LoadedTarget,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        eos_token_ids: Sequence[int] | None = None,
    ) -> list[list[int]]:
        if not prompts:
            return []
        need_len = max(len(p) for p in prompts) + max_new_tokens
        need_rows = min(len(prompts), self.max_batch_size)
        runner = self.runner
        if runner is None or runner.max_seq_len < need_len or runner.max_batch_size < need_rows:
            rows = max(need_rows, self.reserved_rows, runner.max_batch_size if runner is not None else 0)
            if target.device.type == "cuda":  # graphs: batches run padded, so hold the padded rows
                rows = padded_rows(rows, max(rows, self.max_batch_size))
            length = max(need_len, self.reserved_seq_len)
            length = -(-length // RUNNER_LENGTH_STEP) * RUNNER_LENGTH_STEP
            self.runner = runner = None  # free the old cache before allocating the new one
            runner = make_runner(target, (), max_batch_size=rows, max_seq_len=length)
            log.info("plain generation runner: max_batch_size=%d, max_seq_len=%d", rows, length)
            self.runner = runner
        return generate_plain(
            runner,
            prompts,
            max_new_tokens,
            temperature,
            top_p,
            seed,
            eos_token_ids,
            max_batch_size=self.max_batch_size,
            continuous=self.continuous,
        )
