"""Greedy verification inside the fast runner's forward (and its CUDA graph): the accepted path of
each tree the forward ran, computed on the device from the forward's own inputs and logits, so the
round loop reads one small tensor instead of the logits. `forced` is the scale-model benchmark's
instrument (`engine.forced`): accept recorded paths instead of comparing tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from eaglewire.engine.runners.protocol import TargetForward
from eaglewire.engine.verify import greedy_paths

if TYPE_CHECKING:
    from eaglewire.engine.forced import ForcedAcceptance


def tree_greedy_paths(
    input_ids: torch.Tensor,
    tree_mask: torch.Tensor | None,
    logits: torch.Tensor,
    positions: torch.Tensor | None = None,
    forced: ForcedAcceptance | None = None,
) -> torch.Tensor:
    """`greedy_paths` of the trees a forward ran: input_ids [B, N]; tree_mask [B, N, N] (None: causal,
    a chain); logits [B, N, V] -> [B, 1 + 2N]. forced (with the nodes' positions [B, N]): accept
    its recorded paths instead (`engine.forced`)."""
    B, N = input_ids.shape
    dev = logits.device
    if tree_mask is None:
        tree_mask = torch.ones(N, N, dtype=torch.bool, device=dev).tril().expand(B, N, N)
    tree_mask = tree_mask.to(dev)
    agreed = None if forced is None or positions is None else forced.agreed(positions.to(dev), tree_mask)
    return greedy_paths(input_ids.to(dev), tree_mask, logits, agreed)


def with_greedy(
    logits: torch.Tensor,
    aux: torch.Tensor,
    input_ids: torch.Tensor,
    tree_mask: torch.Tensor | None,
    greedy: bool,
    positions: torch.Tensor | None = None,
    forced: ForcedAcceptance | None = None,
) -> TargetForward:
    paths = tree_greedy_paths(input_ids, tree_mask, logits, positions, forced) if greedy else None
    return TargetForward(logits=logits, aux=aux, greedy=paths)
