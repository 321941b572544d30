"""RecomputeRunner: a `TargetRunner` over any Hugging Face causal LM by full recomputation, no KV cache.

Every forward recomputes each row's committed tokens plus its new ones with a 4D additive mask
(committed: causal; new token i: the committed prefix plus new tokens j where tree_mask[i, j])
and explicit position ids. Slow (quadratic in the sequence length) but correct for any
architecture transformers runs, e.g. DeepSeek-V3: the fallback for targets the fast runtime does
not cover, and the reference it is compared against (`--runner hf`). The aux states come from
capture's hooks, so they are the contract's boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from eaglewire.contract.fingerprint import StateKey
from eaglewire.engine.fits import model_positions
from eaglewire.engine.runners.protocol import TargetForward, check_boundaries
from eaglewire.errors import ConfigError, expected_actual
from eaglewire.target.capture import hooked_states, mla_heads_fixed, mla_modules
from eaglewire.target.loading import LoadedTarget

MAX_BATCH_SIZE = 256  # rows are recomputed together; more only costs memory and time
NO_POSITION_LIMIT = 1 << 20  # a config without max_position_embeddings: no cache to bound the length


class RecomputeRunner:
    """A `TargetRunner` (see `protocol`) over `target.model`, capturing `aux_boundaries`.

    max_seq_len None: the positions the model was configured for (`max_position_embeddings`); with
    no cache to fill, the only other limit is time."""

    def __init__(
        self,
        target: LoadedTarget,
        aux_boundaries: Sequence[int],
        *,
        max_batch_size: int = MAX_BATCH_SIZE,
        max_seq_len: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.model = target.model
        if dtype is not None and dtype != target.dtype:
            raise ConfigError(
                expected_actual("RecomputeRunner dtype", f"the target's own {target.dtype}", dtype),
                fix="load the target in the dtype you want (load_target(..., dtype=...))",
            )
        cfg: Any = target.config
        self.num_layers = target.num_layers
        self.vocab_size = target.vocab_size
        self.hidden_size = target.hidden_size
        self.device = target.device
        self.dtype = target.dtype
        self.aux_boundaries = check_boundaries(aux_boundaries, self.num_layers)
        self.eos_token_ids = target.eos_token_ids
        self.max_batch_size = max_batch_size
        self.max_positions = model_positions(cfg)  # the model's; max_seq_len bounds this runner's sequences
        if max_seq_len is None:
            max_seq_len = int(getattr(cfg, "max_position_embeddings", None) or NO_POSITION_LIMIT)
        self.max_seq_len = max_seq_len
        self._mla = mla_modules(self.model)  # found once: every forward needs them
        self._ids: list[torch.Tensor] = []
        self._pos: list[torch.Tensor] = []
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # input_ids, positions [B, N]
        self.reset(1)

    def reset(self, batch_size: int) -> None:
        if not 1 <= batch_size <= self.max_batch_size:
            raise ConfigError(
                expected_actual("reset(batch_size)", f"1..{self.max_batch_size}", batch_size),
                fix="build the runner with a larger max_batch_size",
            )
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        self._ids = [empty] * batch_size
        self._pos = [empty] * batch_size
        self._last = None

    @property
    def batch_size(self) -> int:
        return len(self._ids)

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([len(r) for r in self._ids], dtype=torch.long, device=self.device)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        *,
        logits_at: torch.Tensor | None = None,
    ) -> TargetForward:
        """Same contract as FastTargetRunner.forward: input_ids, positions [B, N]; tree_mask [B, N, N]
        bool or None (causal) -> logits [B, N, V] (or [B, 1, V] at index logits_at [B] of each row),
        aux [B, N, A*Ht]."""
        B, N = input_ids.shape
        if self.batch_size != B or positions.shape != (B, N):
            raise ConfigError(
                expected_actual(
                    "forward input_ids/positions",
                    f"[B={self.batch_size}, N] both",
                    f"{tuple(input_ids.shape)} and {tuple(positions.shape)}",
                ),
                fix="call reset(batch_size) with the batch size you forward",
            )
        dev = self.device
        input_ids, positions = input_ids.to(dev), positions.to(dev)
        lens = [len(r) for r in self._ids]
        if max(lens) + N > self.max_seq_len:
            raise ConfigError(
                f"sequence full: {max(lens)} + {N} tokens exceed max_seq_len={self.max_seq_len}",
                fix="build the runner with a larger max_seq_len, or generate fewer tokens",
            )
        T = max(lens) + N
        full_ids = torch.zeros(B, T, dtype=torch.long, device=dev)
        full_pos = torch.zeros(B, T, dtype=torch.long, device=dev)
        allowed = torch.eye(T, dtype=torch.bool, device=dev).repeat(B, 1, 1)  # [B, T, T]
        tree = (
            torch.ones(N, N, dtype=torch.bool, device=dev).tril().expand(B, N, N)
            if tree_mask is None
            else tree_mask.to(dev, torch.bool)
        )
        for b, n0 in enumerate(lens):
            full_ids[b, :n0], full_ids[b, n0 : n0 + N] = self._ids[b], input_ids[b]
            full_pos[b, :n0], full_pos[b, n0 : n0 + N] = self._pos[b], positions[b]
            full_pos[b, n0 + N :] = positions[b, -1]
            allowed[b, :n0, :n0] = torch.ones(n0, n0, dtype=torch.bool, device=dev).tril()
            allowed[b, n0 : n0 + N, :n0] = True
            allowed[b, n0 : n0 + N, n0 : n0 + N] = tree[b] | torch.eye(N, dtype=torch.bool, device=dev)
        neg = torch.finfo(self.dtype).min
        mask = torch.zeros(B, 1, T, T, dtype=self.dtype, device=dev).masked_fill(~allowed[:, None], neg)
        aux_keys = [StateKey(b, "pre") for b in self.aux_boundaries]
        # logits only from the first new token of the shortest row on: every row's new tokens
        keep = T - min(lens)
        with mla_heads_fixed(self._mla), hooked_states(self.model, list(dict.fromkeys(aux_keys))) as store:
            out = self.model(
                input_ids=full_ids,
                position_ids=full_pos,
                attention_mask=mask,
                use_cache=False,
                logits_to_keep=keep,
            )
        gather = torch.tensor(lens, device=dev)[:, None] + torch.arange(N, device=dev)  # [B, N]

        def take(t: torch.Tensor, start: int = 0) -> torch.Tensor:
            """t [B, T - start, X] -> [B, N, X] at each row's new tokens."""
            return torch.gather(t, 1, (gather - start)[:, :, None].expand(B, N, t.shape[-1]))

        logits = take(out.logits, T - keep).float()  # [B, N, V]
        if logits_at is not None:
            logits = torch.gather(logits, 1, logits_at.to(dev).view(B, 1, 1).expand(B, 1, logits.shape[-1]))
        parts = [take(store[k]) for k in aux_keys]
        # [B, N, A*Ht]; no aux boundaries (plain decoding): [B, N, 0]
        aux = torch.cat(parts, dim=-1) if parts else logits.new_zeros(B, N, 0).to(self.dtype)
        self._last = (input_ids, positions)
        return TargetForward(logits=logits, aux=aux)

    def commit(self, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Append the accepted tokens (indices into the last forward's N, in path order) to each row's
        committed prefix; their positions must continue it."""
        if self._last is None:
            raise ConfigError("commit() without a forward() before it", fix="forward() the tokens first")
        ids, pos = self._last
        accepted, num = accepted.to("cpu"), num_accepted.to("cpu")
        for b in range(self.batch_size):
            idx = accepted[b, : int(num[b])].to(self.device)
            start = len(self._ids[b])
            got = pos[b, idx].tolist()
            want = list(range(start, start + len(got)))
            if got != want:
                raise ConfigError(
                    expected_actual(
                        f"row {b}: positions of the accepted tokens (committed length {start})", want, got
                    ),
                    fix="commit a path of the last forward in path order (root first), at positions "
                    "that continue the committed prefix",
                )
            self._ids[b] = torch.cat([self._ids[b], ids[b, idx]])
            self._pos[b] = torch.cat([self._pos[b], pos[b, idx]])

    def commit_prefix(self, num_accepted: torch.Tensor) -> None:
        """Keep the first num_accepted[b] ([B]) tokens of the last forward of each row."""
        if self._last is None:
            raise ConfigError(
                "commit_prefix() without a forward() before it", fix="forward() the tokens first"
            )
        N = self._last[0].shape[1]
        self.commit(torch.arange(N).expand(self.batch_size, N), num_accepted)

    def sync_lengths(self) -> torch.Tensor:
        return self.lengths.to("cpu")
