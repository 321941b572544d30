"""Linears multiplied as one matrix, with no second copy of their weights."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


@torch.no_grad()
def stack_in_place(linears: Sequence[nn.Linear]) -> torch.Tensor:
    """The linears' weights as one [sum of out, in] tensor, each weight becoming a view of its rows:
    the same values and parameter objects, one copy in memory, no concatenation per product."""
    weights: list[torch.Tensor] = [m.weight for m in linears]
    stacked = torch.cat([w.detach() for w in weights])
    for m, rows in zip(linears, stacked.split([w.shape[0] for w in weights]), strict=True):
        m.weight.data = rows
    return stacked
