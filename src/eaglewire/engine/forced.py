"""Forced acceptance: a benchmark instrument that makes greedy verification accept recorded paths.

A scale-model benchmark (`benchmarks/scale_model.py`) runs a random-weight target and draft at a
large model's shape through the real round loop. Random weights accept nothing, so the rounds
would all be one token long; instead each round accepts the path a trained draft's round accepted
(`DecodeTrace.accepted_paths`, recorded by `eaglewire bench`). Everything else runs as it does for
a real draft: the draft forwards, the verify forward, the commit of the path, the draft extend with
the path's aux rows and the next root (the target's argmax after the path: the bonus token).

The verdict replaces only the comparison of tokens (`engine.verify.greedy_paths`, argument
`agreed`), inside the runner's verify forward: in its CUDA graph and in the launch-ahead loop too,
with no host involvement per round. The table is keyed by the round's root position, not by a
round counter: a replayed round emits exactly its recorded tokens, so its root position is known
in advance, and a lookup by position is stateless (a CUDA graph's warm-up runs, which execute the
forward before capturing it, would advance a counter).

Node numbering depends on the draft's scores (EAGLE-2 reranking), so a random draft's tree is
shaped differently from the trained draft's. The round therefore accepts the path ending at the
recorded last node when that node sits at the recorded depth in this tree (always so for chains,
and for trees shaped as recorded), else the path to the first node at that depth (the same
number of tokens, which is what the round's cost depends on), else the deepest node above it.
A round that falls short so roots the next one a few positions early: every position after a
recorded root up to the next one maps to that next round, so the rounds after a shortfall keep
their recorded lengths (they run a little behind; the stop rule ends the generation as recorded).

Not for decoding: the emitted tokens are not the target's greedy output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eaglewire.errors import ConfigError, expected_actual


class ForcedAcceptance:
    """Recorded accepted paths by root position, on the device. Set it as a fast runner's
    `forced_acceptance` before the runner verifies (it enters the CUDA-graph key); `load` each
    prompt's rounds before generating it (in place: captured graphs keep reading these buffers)."""

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        self.capacity = capacity  # root positions the table covers (the runner's max_seq_len)
        self.device = torch.device(device)
        # [capacity] accepted drafts (path nodes - 1) of the next recorded round rooted at or after
        # this position; 0 past the last one (the root alone: a launch-ahead loop's discarded round)
        self.depth = torch.zeros(capacity, dtype=torch.long, device=self.device)
        self.last = torch.zeros(capacity, dtype=torch.long, device=self.device)  # [capacity] last path node

    def load(self, first_root_position: int, paths: Sequence[Sequence[int]]) -> None:
        """paths: each round's accepted tree nodes, root first (`DecodeTrace.accepted_paths`);
        first_root_position: the first round's root position (prompt tokens - 1)."""
        depth = torch.zeros(self.capacity, dtype=torch.long)
        last = torch.zeros(self.capacity, dtype=torch.long)
        position, previous = first_root_position, 0
        for i, path in enumerate(paths):
            if not path or path[0] != 0 or list(path) != sorted(set(path)):
                raise ConfigError(
                    expected_actual(
                        f"accepted path of round {i}", "tree nodes, root (0) first, increasing", path
                    ),
                    fix="pass accepted_paths as `eaglewire bench` records them",
                )
            if position >= self.capacity:
                raise ConfigError(
                    f"round {i}'s root position {position} is past the table's {self.capacity} positions",
                    fix="build the ForcedAcceptance (and the runner) with a larger max_seq_len",
                )
            depth[previous : position + 1], last[previous : position + 1] = len(path) - 1, path[-1]
            previous, position = position + 1, position + len(path)
        self.depth.copy_(depth)
        self.last.copy_(last)

    def agreed(self, positions: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """positions [B, N] (node 0 the root); ancestors [B, N, N] ancestor-or-self masks -> [B, N]
        bool: the nodes on the forced path (see the module doc), for `greedy_paths(agreed=...)`.
        Device work only (graph-capturable)."""
        B, N = positions.shape
        root = positions[:, 0].clamp(0, self.capacity - 1)  # [B]
        depth, last = self.depth[root], self.last[root]  # [B] each
        index = torch.arange(N, device=positions.device)
        depths = ancestors.sum(dim=-1) - 1  # [B, N]
        # deepest node not deeper than the recorded depth; then the recorded node; then the first
        rank = depths * (2 * N) + (index == last[:, None]) * N + (N - 1 - index)  # [B, N]
        end = torch.where(depths <= depth[:, None], rank, -1).argmax(dim=-1)  # [B]
        return ancestors.gather(1, end[:, None, None].expand(B, 1, N)).squeeze(1)  # [B, N]
