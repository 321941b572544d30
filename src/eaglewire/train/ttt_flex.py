"""The TTT chain's attention as one block-sparse FlexAttention call per step (CUDA training).

Same visibility as `ttt._ChainKeys` (and the dense `ttt.ttt_attention_mask`): at step s, row t sees

    step-0 keys at rows t' <= t of the same record     (the prefix: causal within the record)
    the keys of steps 1..s at row t only               (its own chain)

Why another form: the blocked SDPA form hands the fused kernels a dense boolean mask, so every
query block reads all T prefix keys, although packed rows hold records of ~250 tokens and a row
sees only its own record's earlier rows. FlexAttention skips the 128x128 blocks its block mask
marks empty: the prefix costs about one record's length per row instead of T, and each chain
step one diagonal block. On the H200 the blocked form's attention was 43 of a 140 ms step's
kernel time (docs/history/benchmarks-log.md §2n).

Shapes stay static so that one compiled kernel (forward and backward) serves every step and
batch: rows are padded to a multiple of `BLOCK` and the keys always hold S step blocks, those of
steps not yet run being zeros that the block mask never visits.

FlexAttention has no CPU backward (torch 2.13), so CPU training keeps `ttt._ChainKeys`; CPU tests
check this module's forward against the dense mask, `tests/gpu/` its gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

BLOCK = 128  # FlexAttention's default block size: rows are padded to a multiple of it

_compiled: dict[str, Callable[..., torch.Tensor]] = {}


def _flex_attention(compiled: bool) -> Callable[..., torch.Tensor]:
    """flex_attention, compiled once per process on CUDA (eager it materialises every score)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _compiled:
        _compiled["flex"] = torch.compile(flex_attention, dynamic=False)
    return _compiled["flex"]


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block booleans [B, 1, NQ, NK] -> (count [B, 1, NQ], indices [B, 1, NQ, NK]; the listed first, in order)."""
    count = blocks.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return count, indices


def prefix_blocks(doc_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """doc_ids [B, Tp] -> (partial, full) [B, NB, NB] booleans for the prefix (causal within a record),
    from each block's smallest and largest record id, without evaluating the mask row by row.

    A block pair whose id ranges do not meet cannot hold a visible (row, key) pair; one that may is
    partial (the mask is applied inside it), unless both blocks hold one and the same record and the
    keys' block is earlier: then every key is visible (full, no mask applied). Ranges over-approximate
    the records a block holds, so the partial blocks may include some that are all masked (the mask
    inside them still hides those keys); no visible key is ever left out."""
    B, Tp = doc_ids.shape
    blocks = doc_ids.view(B, Tp // BLOCK, BLOCK)
    lo, hi = blocks.amin(dim=-1), blocks.amax(dim=-1)  # [B, NB]
    nb = lo.shape[1]
    q_lo, q_hi, k_lo, k_hi = lo[:, :, None], hi[:, :, None], lo[:, None, :], hi[:, None, :]  # [B, NB, NB]
    idx = torch.arange(nb, device=doc_ids.device)
    earlier_or_same = idx[None, :] <= idx[:, None]  # [NB(q), NB(k)]
    earlier = idx[None, :] < idx[:, None]
    meet = (q_lo <= k_hi) & (k_lo <= q_hi) & earlier_or_same
    one_record = (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)
    full = meet & one_record & earlier
    return meet & ~full, full


def chain_block_masks(doc_ids: torch.Tensor, num_steps: int) -> list[Any]:
    """doc_ids [B, Tp] (Tp a multiple of BLOCK; -1 = padding) -> one BlockMask per step s over
    num_steps*Tp keys (key block j = step j's keys): step s sees the prefix and chain steps 1..s.

    The blocks come from `prefix_blocks` and the chain's diagonal blocks, not from `create_block_mask`:
    that evaluates the mask at every (row, key) of every step (on the H200 a forward took 116 ms
    against 39 for the blocked form, most of it building 7 masks of 16 x 1,024 x 7,168)."""
    from torch.nn.attention.flex_attention import BlockMask

    B, Tp = doc_ids.shape
    nb = Tp // BLOCK
    partial, full = prefix_blocks(doc_ids)  # [B, NB, NB]
    diagonal = torch.eye(nb, dtype=torch.bool, device=doc_ids.device).expand(B, nb, nb)

    def visible(step: int) -> Callable[..., torch.Tensor]:
        # The step is a tensor, not a Python int: the compiled kernel guards on a closure's ints by
        # value, so an int would compile once per step and per batch until dynamo's recompile limit
        # sends every call to the unfused path (H200: 618 ms against 98 for the blocked form). Filled
        # on the device: torch.tensor(step, device=...) copies from pageable host memory, which waits
        # for the stream, 7 times an unroll, and the next batch's preparation no longer overlaps.
        last = torch.full((), step, dtype=torch.long, device=doc_ids.device)

        def mask_mod(
            b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            j, r = kv_idx // Tp, kv_idx % Tp  # key of step j at row r
            prefix = (j == 0) & (r <= q_idx) & (doc_ids[b, r] == doc_ids[b, q_idx])
            chain = (j >= 1) & (j <= last) & (r == q_idx)
            return prefix | chain

        return mask_mod

    none = torch.zeros_like(partial)
    full_kv = torch.cat([full] + [none] * (num_steps - 1), dim=-1)[:, None]  # [B, 1, NB, S*NB]
    full_count, full_indices = _ordered(full_kv)
    masks = []
    for s in range(num_steps):
        steps = [partial] + [diagonal if j <= s else none for j in range(1, num_steps)]
        count, indices = _ordered(torch.cat(steps, dim=-1)[:, None])  # [B, 1, NB], [B, 1, NB, S*NB]
        masks.append(
            BlockMask.from_kv_blocks(
                count,
                indices,
                full_count,
                full_indices,
                BLOCK_SIZE=BLOCK,
                mask_mod=visible(s),
                seq_lengths=(Tp, num_steps * Tp),
            )
        )
    return masks


class FlexChainKeys:
    """The `DraftKV` of one TTT unroll, attended with FlexAttention (see the module docstring)."""

    def __init__(self, doc_ids: torch.Tensor, num_steps: int, *, compiled: bool | None = None) -> None:
        self.T = int(doc_ids.shape[1])
        self.pad = -self.T % BLOCK
        doc = F.pad(doc_ids, (0, self.pad), value=-1) if self.pad else doc_ids  # [B, Tp]
        self.num_steps = num_steps
        self.masks = chain_block_masks(doc, num_steps)
        self.flex = _flex_attention(doc_ids.device.type == "cuda" if compiled is None else compiled)
        self.keys: list[torch.Tensor] = []  # step j: [B, nkv, Tp, hd]
        self.values: list[torch.Tensor] = []

    def _padded(self, x: torch.Tensor) -> torch.Tensor:  # [B, h, T, hd] -> [B, h, Tp, hd]
        return F.pad(x, (0, 0, 0, self.pad)) if self.pad else x

    def _all_steps(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """S key blocks along the sequence axis, zeros for steps not run yet -> [B, nkv, S*Tp, hd]."""
        missing = self.num_steps - len(parts)
        if missing == 0:
            return torch.cat(parts, dim=2)
        zeros = parts[0].new_zeros(*parts[0].shape[:2], missing * parts[0].shape[2], parts[0].shape[3])
        return torch.cat([*parts, zeros], dim=2)

    # Eager inside a compiled draft forward, as `_ChainKeys.attend`: the flex call compiles itself.
    @torch.compiler.disable
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append this step's k, v [B, nkv, T, hd]; q [B, nh, T, hd] -> [B, nh, T, hd]."""
        if mask is not None:
            raise ValueError("the TTT chain builds its own attention mask; pass mask=None")
        step = len(self.keys)
        if step >= self.num_steps:
            raise ValueError(f"FlexChainKeys was built for {self.num_steps} steps; step {step} asked")
        self.keys.append(self._padded(k))
        self.values.append(self._padded(v))
        out = self.flex(
            self._padded(q),
            self._all_steps(self.keys),
            self._all_steps(self.values),
            block_mask=self.masks[step],
            enable_gqa=q.shape[1] != k.shape[1],
        )  # [B, nh, Tp, hd]
        return out[:, :, : self.T] if self.pad else out
