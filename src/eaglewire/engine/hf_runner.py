"""A TargetRunner over any Hugging Face causal LM, by full recomputation: slow, simple, correct.

It keeps no KV cache: every `forward` reruns the whole committed sequence plus the new tokens
with a 4D attention mask (committed tokens causal; new tokens see the committed prefix and,
among themselves, `tree_mask`). That makes it the reference the fast runtime is compared
against, and the fallback for architectures the fast runtime does not cover. Aux states come
from the same hooks `eaglewire.target.capture` uses, so they are the contract's boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from eaglewire.contract.fingerprint import StateKey
from eaglewire.engine.interfaces import TargetForward
from eaglewire.errors import expected_actual
from eaglewire.target.capture import hooked_states

MAX_BATCH_SIZE = 256  # rows are recomputed one by one; more only costs time


class HFTargetRunner:
    """TargetRunner (see `eaglewire.engine.interfaces`) over `model`, capturing `aux_boundaries`."""

    def __init__(self, model: nn.Module, aux_boundaries: Sequence[int]) -> None:
        self.model = model
        cfg: Any = model.config
        self.num_layers = int(cfg.num_hidden_layers)
        self.vocab_size = int(cfg.vocab_size)
        # No cache to fill: the only limits are the positions the model was configured for, and time.
        self.max_seq_len = int(getattr(cfg, "max_position_embeddings", None) or 1 << 20)
        self.max_batch_size = MAX_BATCH_SIZE
        eos = getattr(cfg, "eos_token_id", None)
        self.eos_token_ids: tuple[int, ...] = (eos,) if isinstance(eos, int) else tuple(eos or ())
        first = next(model.parameters())
        self.device = first.device
        self.dtype = first.dtype
        self.aux_keys = [StateKey(b, "pre") for b in aux_boundaries]
        self._committed: list[list[int]] = []
        self._last_ids: torch.Tensor | None = None  # [B, N] of the last forward
        self._last_positions: torch.Tensor | None = None

    def reset(self, batch_size: int) -> None:
        self._committed = [[] for _ in range(batch_size)]
        self._last_ids = self._last_positions = None

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([len(c) for c in self._committed], dtype=torch.long)

    def _mask(self, committed: int, tree_mask: torch.Tensor | None, n: int) -> torch.Tensor:
        """[1, 1, C+N, C+N] mask for one row: bool (True = attend), or additive float for eager attention."""
        total = committed + n
        allowed = torch.ones(total, total, dtype=torch.bool, device=self.device).tril()
        if tree_mask is not None:
            allowed[committed:, committed:] = tree_mask.to(self.device)
        if getattr(self.model.config, "_attn_implementation", None) != "eager":
            return allowed[None, None]
        additive = torch.zeros(total, total, dtype=self.dtype, device=self.device)
        additive.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return additive[None, None]

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        *,
        logits_at: torch.Tensor | None = None,
    ) -> TargetForward:
        """input_ids, positions [B, N]; tree_mask [B, N, N] bool or None (causal) -> logits [B, N, V]
        (or [B, 1, V] at index logits_at [B] of each row, as the fast runtime offers), aux [B, N, A*Ht]."""
        B, N = input_ids.shape
        if len(self._committed) != B:
            raise ValueError(expected_actual("batch rows", len(self._committed), B))
        if positions.shape != (B, N):
            raise ValueError(expected_actual("positions shape", (B, N), tuple(positions.shape)))
        logits, aux = [], []
        for b in range(B):
            committed = self._committed[b]
            C = len(committed)
            ids = torch.cat([torch.tensor(committed, dtype=torch.long), input_ids[b].cpu()])[None].to(
                self.device
            )
            pos = torch.cat([torch.arange(C), positions[b].cpu()])[None].to(self.device)
            mask = self._mask(C, None if tree_mask is None else tree_mask[b], N)
            with hooked_states(self.model, self.aux_keys) as store:
                out = self.model(
                    input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=N
                )
            row_logits = out.logits[0].float()  # [N, V]
            logits.append(row_logits if logits_at is None else row_logits[int(logits_at[b])][None])
            parts = [store[k][0, C:] for k in self.aux_keys]
            # [N, A*Ht]; no aux boundaries (plain decoding): [N, 0]
            aux.append(torch.cat(parts, dim=-1) if parts else row_logits.new_zeros(N, 0).to(self.dtype))
        self._last_ids, self._last_positions = input_ids.cpu(), positions.cpu()
        return TargetForward(logits=torch.stack(logits), aux=torch.stack(aux))

    def commit(self, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Append the accepted tokens (indices into the last forward's N) to each row's committed prefix."""
        if self._last_ids is None or self._last_positions is None:
            raise RuntimeError("commit() without a forward() before it")
        for b, n in enumerate(num_accepted.tolist()):
            idx = accepted[b, :n].cpu()
            start = len(self._committed[b])
            got = self._last_positions[b, idx].tolist()
            want = list(range(start, start + n))
            if got != want:
                raise ValueError(
                    expected_actual(
                        f"row {b}: positions of the accepted tokens (committed length {start})", want, got
                    )
                )
            self._committed[b].extend(self._last_ids[b, idx].tolist())
        self._last_ids = self._last_positions = None
