"""The record types every stage exchanges. Storage lives in records.py / shards.py.

A tokenized record is one rendered conversation: its token ids and which positions the loss
is taken on (assistant tokens). A captured record adds the target's hidden states for it; a
shard's content is consecutive captured records back to back, as a shard file stores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from eaglewire.errors import DataFormatError


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


@dataclass(frozen=True)
class ShardContent:
    """Consecutive captured records as a shard stores them: each tensor is its parts joined along
    dim 0, the records back to back (N = sum of `lengths`).

    Capture packs a shard's records into one host buffer per tensor as their states arrive, so each
    tensor is one part and writing a shard takes a handful of system calls (shards.py says why that
    matters); `from_records` makes one part per record instead, without copying."""

    record_ids: list[str]
    lengths: list[int]  # tokens per record, in order
    input_ids: list[torch.Tensor]  # parts of [N] int64
    loss_mask: list[torch.Tensor]  # parts of [N] bool
    aux: list[torch.Tensor]  # parts of [N, A*Ht], aux states in contract order
    final: list[torch.Tensor]  # parts of [N, Ht]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def tensors(self) -> dict[str, list[torch.Tensor]]:
        return {
            "input_ids": self.input_ids,
            "loss_mask": self.loss_mask,
            "aux": self.aux,
            "final": self.final,
        }

    @classmethod
    def from_records(cls, records: Sequence[CapturedRecord]) -> ShardContent:
        """One part per record (views, no copy); raises naming the record whose lengths disagree or
        whose states differ in width or dtype from the first record's."""
        if not records:
            raise DataFormatError("a shard needs at least one record, got none")
        first = records[0]
        for r in records:
            T = int(r.input_ids.numel())
            if r.loss_mask.shape != (T,) or r.aux.shape[0] != T or r.final.shape[0] != T:
                raise DataFormatError(
                    f"record {r.record_id}: lengths disagree: input_ids {T}, loss_mask {tuple(r.loss_mask.shape)}, "
                    f"aux {tuple(r.aux.shape)}, final {tuple(r.final.shape)}"
                )
            for name, t, t0 in (("aux", r.aux, first.aux), ("final", r.final, first.final)):
                if t.shape[1:] != t0.shape[1:] or t.dtype != t0.dtype:
                    raise DataFormatError(
                        f"record {r.record_id}: {name} {tuple(t.shape)} {t.dtype} does not match record "
                        f"{first.record_id}'s {name} {tuple(t0.shape)} {t0.dtype} (same width and dtype expected)"
                    )
        return cls(
            record_ids=[r.record_id for r in records],
            lengths=[int(r.input_ids.numel()) for r in records],
            input_ids=[r.input_ids.to(torch.int64) for r in records],
            loss_mask=[r.loss_mask.bool() for r in records],
            aux=[r.aux for r in records],
            final=[r.final for r in records],
        )

    def records(self) -> list[CapturedRecord]:
        """The records again, each a view into the joined tensors (parts joined first when there are
        several)."""
        joined = {k: v[0] if len(v) == 1 else torch.cat(v) for k, v in self.tensors().items()}
        out, lo = [], 0
        for record_id, T in zip(self.record_ids, self.lengths, strict=True):
            rows = slice(lo, lo + T)
            out.append(
                CapturedRecord(
                    record_id,
                    joined["input_ids"][rows],
                    joined["loss_mask"][rows],
                    joined["aux"][rows],
                    joined["final"][rows],
                )
            )
            lo += T
        return out
