"""The seam between a target runner (fast or recompute) and the decoding loops above it.

A `TargetRunner` owns the target's KV cache. Each `forward` appends N new tokens *provisionally*
(they attend to the committed prefix plus each other through `tree_mask`); `commit` then keeps
only the accepted ones, in path order, and advances the committed length. Plain decoding is
forward(1 token) + commit([0]); verification is forward(N tree nodes) + commit(accepted path).
Every forward also returns the contract's aux states for its tokens, so the draft's next input
comes out of verification for free.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard

import torch

from eaglewire.errors import BoundaryError, expected_actual


@dataclass
class TargetForward:
    logits: torch.Tensor  # [B, N, V] (float32 for sampling/argmax)
    aux: torch.Tensor  # [B, N, A*Ht] aux states in contract order, for the same N tokens
    # [B, 1 + 2N] greedy verification of the tree the forward ran (`engine.verify.greedy_paths`),
    # when the runner was asked for it (`forward(..., greedy=True)`): inside a replayed CUDA graph
    # it costs no launches of its own
    greedy: torch.Tensor | None = None


class TargetRunner(Protocol):
    num_layers: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype

    def reset(self, batch_size: int) -> None:
        """Forget every sequence; start `batch_size` empty ones."""
        ...

    @property
    def lengths(self) -> torch.Tensor:
        """[B] committed tokens per sequence (positions 0..len-1 are in the cache)."""
        ...

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None
    ) -> TargetForward:
        """input_ids, positions [B, N]; tree_mask [B, N, N] bool (True = new token i sees new token j),
        None = causal among the new tokens. Every new token also sees the whole committed prefix.
        Rows of a batch may be right-padded: padded positions are ignored by commit."""
        ...

    def commit(self, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """accepted [B, n] indices into the last forward's N tokens, in path order; num_accepted [B]
        how many of each row are real (the rest is padding). Keeps those tokens' K/V at positions
        len..len+num_accepted-1 and advances `lengths`."""
        ...


def check_boundaries(aux_boundaries: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """The aux boundaries a runner captures, each a boundary of a `num_layers`-layer target."""
    bounds = tuple(int(b) for b in aux_boundaries)
    bad = [b for b in bounds if not 0 <= b <= num_layers]
    if bad:
        raise BoundaryError(
            expected_actual("aux_boundaries", f"each in 0..L={num_layers}", list(bounds)),
            fix="take the boundaries from the draft's contract.json (or contract.default_boundaries)",
        )
    return bounds


def commit_leading(runner: TargetRunner, counts: torch.Tensor, width: int) -> None:
    """Keep the first counts[b] ([B]) of the last forward's `width` new tokens of each row: they are
    already in place, so a runner with `commit_prefix` only advances its lengths (no K/V copy);
    any other runner commits those leading indices."""
    keep_prefix = getattr(runner, "commit_prefix", None)
    if keep_prefix is not None:
        keep_prefix(counts)
    else:
        B = counts.shape[0]
        runner.commit(torch.arange(width).expand(B, width), counts)


def reserve_verify_width(runner: TargetRunner, num_new_tokens: int) -> None:
    """Widen the CUDA-graphed forward width of a runner that has one (the fast runtime) to trees of
    `num_new_tokens` nodes, so their verification replays a graph too; other runners are left alone."""
    reserve = getattr(runner, "reserve_verify_width", None)
    if reserve is not None:
        reserve(num_new_tokens)


class LaunchAheadRunner(TargetRunner, Protocol):
    """A runner a round can be enqueued on before the last verdict is read (`engine.pipelined`): it
    verifies greedily inside its forward, and takes the caller's bound on the committed lengths
    instead of reading them (so choosing a window never waits for the device)."""

    @property
    def max_seq_len(self) -> int: ...

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        *,
        greedy: bool = False,
        length_bound: int | None = None,
    ) -> TargetForward: ...

    def commit_prefix(self, num_accepted: torch.Tensor) -> None: ...


def can_launch_ahead(runner: TargetRunner) -> TypeGuard[LaunchAheadRunner]:
    """Whether `runner` offers what `LaunchAheadRunner` names (the fast runtime does; the recompute
    runner, which recomputes on the host's schedule, does not)."""
    params = inspect.signature(runner.forward).parameters
    return (
        "greedy" in params
        and "length_bound" in params
        and hasattr(runner, "commit_prefix")
        and isinstance(getattr(runner, "max_seq_len", None), int)
    )
