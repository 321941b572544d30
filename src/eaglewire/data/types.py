"""The record types every stage exchanges. Storage lives in records.py / shards.py.

A tokenized record is one rendered conversation: its token ids and which positions the loss
is taken on (assistant tokens). A captured record adds the target's hidden states for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenizedRecord:
    record_id: str  # stable id from the source (file:line or builtin-set:index), used for resume and splits
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool: True where the *token at this position* is an assistant token


@dataclass
class CapturedRecord:
    record_id: str
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool
    aux: torch.Tensor  # [T, A*Ht] aux states in contract order
    final: torch.Tensor  # [T, Ht] the contract's final state (pre-norm by default)
