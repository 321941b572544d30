"""Training-time test (TTT): S unrolled draft steps over every position at once, wired as served.

Alignment (0-based token index t inside one record; `h_t` = the target's aux states at t):

    step 0, row t:  hidden = fc(h_t)           token = x[t+1]   position = t      predicts x[t+2]
    step s, row t:  hidden = out_{s-1}[t]      token = x[t+1+s] position = t + s  predicts x[t+2+s]

The label of step s at row t is the target's next-token distribution *at position t+1+s* (the
distribution from which the target emits x[t+2+s]), and the row counts only where x[t+2+s] is
a training token (`loss_mask[t+2+s]`) inside the same record.

Why this is what serving computes: after the target has consumed x[0..t+1] (its last token
x[t+1] sampled from the target at t), an engine runs the draft over the prefix rows 0..t
(hidden fc(h_p), token x[p+1], position p; causal), takes row t's output as draft token 1,
then feeds the draft its own pre-norm output `DraftOutput.hidden` with the next token at
positions t+1, t+2, ... one at a time, each attending to the whole prefix and to its own earlier
steps. In TTT the keys of step j (j >= 1) for row t are exactly those earlier steps of the chain
that starts at row t, so the mask of step s lets row t see:

    step-0 keys at rows t' <= t of the same record     (the prefix, causal)
    the keys of steps 1..s at row t only               (the diagonal: its own chain)

and RoPE positions advance by one per step (t + s), as the engines' `positions += 1`. Tokens are
the ground truth (x[t+1+s]), i.e. the chain that serving takes when every earlier draft token was
accepted. `tests/unit/train/test_ttt_serving.py` proves logits equality against a step-by-step
decode with a `GrowingKV`.

How it is computed (`ttt_unroll`): the dense form of that mask, `ttt_attention_mask`, has
(s+1)*T keys at step s, although each row sees at most T prefix keys plus s chain keys; summed over
S steps that is S*(S+1)/2 key blocks of T (28 for S = 7). The unroll instead cuts the rows of step
s >= 1 into blocks of `BLOCK_ROWS` that attend to the prefix keys plus the chain keys of their own
rows only (T + s*BLOCK_ROWS keys; ~3x fewer over 7 steps at T = 1024), still one fused SDPA call
per step, with the prefix mask built once per batch. Everything else is `Eagle3Draft.forward`
itself (the chain is its `DraftKV`); tests pin the result to the dense mask through a `GrowingKV`
and to a step-by-step serving decode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eaglewire.draft.model import DraftOutput, Eagle3Draft
from eaglewire.train.config import TTTAttention
from eaglewire.train.ttt_flex import FlexChainKeys


def shift_left(x: torch.Tensor, k: int, fill: float | bool = 0) -> torch.Tensor:
    """x [B, T, ...] -> y with y[:, t] = x[:, t+k] (fill where t+k >= T)."""
    if k == 0:
        return x
    T = x.shape[1]
    pad = x.new_full((x.shape[0], min(k, T), *x.shape[2:]), fill)
    return torch.cat([x[:, k:], pad], dim=1)[:, :T]


def prefix_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """doc_ids [B, T] -> bool [B, T, T]: row t sees rows t' <= t of the same record (padding sees padding)."""
    T = doc_ids.shape[1]
    idx = torch.arange(T, device=doc_ids.device)
    causal = idx[:, None] >= idx[None, :]  # [T, T]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # [B, T, T]
    return causal[None] & same


def ttt_attention_mask(doc_ids: torch.Tensor, step: int, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """The dense mask of TTT step `step` over all keys so far: bool [B, 1, T, (step+1)*T], True = attend.

    The reference form of what `ttt_unroll` computes (keys in `GrowingKV` order, block j = step j);
    the unroll itself never builds it."""
    prefix = prefix_mask(doc_ids) if prefix is None else prefix
    B, T = doc_ids.shape
    if step == 0:
        return prefix[:, None]
    eye = torch.eye(T, dtype=torch.bool, device=doc_ids.device).expand(B, T, T)
    return torch.cat([prefix, *([eye] * step)], dim=-1)[:, None]  # [B, 1, T, (step+1)*T]


def step_in_range(doc_ids: torch.Tensor, step: int) -> torch.Tensor:
    """bool [B, T]: row t has a label at `step` (x[t+2+step] exists in the same record as t)."""
    k = 2 + step
    ahead = shift_left(doc_ids, k, fill=-1)
    return (doc_ids >= 0) & (ahead == doc_ids)


def step_valid(doc_ids: torch.Tensor, loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """bool [B, T]: row t is trained/evaluated at `step` (in range and x[t+2+step] is a training token)."""
    return step_in_range(doc_ids, step) & shift_left(loss_mask, 2 + step, fill=False)


@dataclass(frozen=True)
class StepRows:
    """The rows every TTT step trains on and scores, built once per micro-batch from host tensors, so
    neither the loss nor its normaliser needs a device->host sync (boolean indexing would need one
    per step).

    `scored[s]`: the rows whose draft logits step s needs, those valid at step s or later (the
    accuracy chain reads step s's argmax only there); with assistant-only loss masks that is well
    under half the rows, and the draft's lm_head (Vd wide) is the largest matmul of a step."""

    valid: torch.Tensor  # [S, B, T] bool (step_valid of each step), on the device
    index: tuple[torch.Tensor, ...]  # S x [N_s] int64 flat row index b*T + t of the valid rows, on the device
    counts: tuple[int, ...]  # S: N_s, on the host
    scored: tuple[torch.Tensor, ...]  # S x [M_s] int64 ascending flat rows valid at step s or later

    @property
    def num_steps(self) -> int:
        return len(self.counts)


def step_rows(
    doc_ids: torch.Tensor, loss_mask: torch.Tensor, num_steps: int, device: torch.device | str
) -> StepRows:
    """doc_ids, loss_mask [B, T] (host tensors: computing here costs no sync) -> StepRows on `device`."""
    valid = torch.stack([step_valid(doc_ids, loss_mask, s) for s in range(num_steps)])  # [S, B, T]
    later = valid.flip(0).cumsum(0).flip(0) > 0  # [S, B, T] valid at this step or a later one
    index = [v.reshape(-1).nonzero().squeeze(1) for v in valid]  # S x [N_s]
    scored = [v.reshape(-1).nonzero().squeeze(1) for v in later]  # S x [M_s]
    counts = tuple(int(i.numel()) for i in index)
    flat = torch.cat([*index, *scored]).to(device, non_blocking=True)  # one copy to the device
    parts = flat.split([*counts, *(int(i.numel()) for i in scored)])
    return StepRows(valid.to(device, non_blocking=True), parts[:num_steps], counts, parts[num_steps:])


# Query rows per block in the blocked attention of steps >= 1 (a multiple of the fused kernels' tiles).
BLOCK_ROWS = 128


class _ChainKeys:
    """Keys/values of one unroll: step 0's for every row (the prefix) and each later step's (the
    diagonal), attended with one fused SDPA call per step.

    Step 0 is plain prefix attention. At step s >= 1 the rows are cut into blocks of BLOCK_ROWS;
    each block attends to the T prefix keys and to the s*BLOCK_ROWS chain keys of its own rows
    (row r of the block sees chain key j*BLOCK_ROWS + r), i.e. T + s*BLOCK_ROWS keys instead of the
    dense (s+1)*T. KV heads are repeated to the query heads (as `enable_gqa` does), so the call
    qualifies for the fused masked kernels (cuDNN, memory-efficient) and not only the math one.
    """

    def __init__(self, prefix: torch.Tensor) -> None:
        self.prefix = prefix  # [B, T, T] bool: True = the prefix key is visible
        self.key0: torch.Tensor | None = None  # [B, nkv, T, hd]
        self.value0: torch.Tensor | None = None
        self.keys: list[torch.Tensor] = []  # step j >= 1: [B, nkv, T, hd]
        self.values: list[torch.Tensor] = []
        self._block_prefix: torch.Tensor | None = None  # [B*nb, 1, m, T] prefix mask per block

    # Run eagerly inside a compiled draft forward: the chain grows by one key block per step, so
    # traced, every TTT step would be its own graph (S forward and S backward compiles); left out,
    # the layer's projections, norms and MLP around it compile once for every step.
    @torch.compiler.disable
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The `DraftKV` of one unroll: append this step's k, v [B, nkv, T, hd] and attend with
        q [B, nh, T, hd] -> [B, nh, T, hd]. The TTT mask is implied by the step; `mask` must be None."""
        if mask is not None:
            raise ValueError("the TTT chain builds its own attention mask; pass mask=None")
        if self.key0 is None:
            self.key0, self.value0 = k, v
        else:
            self.keys.append(k)
            self.values.append(v)
        assert self.key0 is not None and self.value0 is not None
        B, nh, T, hd = q.shape
        g = nh // self.key0.shape[1]

        def heads(x: torch.Tensor) -> torch.Tensor:
            """[B', nkv, L, hd] -> [B', nh, L, hd]: query head h reads KV head h // g."""
            return x.repeat_interleave(g, dim=1) if g > 1 else x

        if not self.keys:
            return F.scaled_dot_product_attention(
                q, heads(self.key0), heads(self.value0), attn_mask=self.prefix[:, None]
            )
        s, m = len(self.keys), min(BLOCK_ROWS, T)
        nb = -(-T // m)
        pad = nb * m - T  # rows added to fill the last block (dropped from the output)

        def blocks(x: torch.Tensor) -> torch.Tensor:  # [B, h, T, hd] -> [B*nb, h, m, hd]
            x = F.pad(x, (0, 0, 0, pad)) if pad else x
            return x.view(B, x.shape[1], nb, m, hd).transpose(1, 2).reshape(B * nb, x.shape[1], m, hd)

        def keys(prefix: torch.Tensor, chain: list[torch.Tensor]) -> torch.Tensor:  # -> [B*nb, nh, T+s*m, hd]
            shared = heads(prefix)[:, None].expand(B, nb, nh, T, hd).reshape(B * nb, nh, T, hd)
            return torch.cat([shared, *(heads(blocks(x)) for x in chain)], dim=2)

        if self._block_prefix is None:
            rows = F.pad(self.prefix, (0, 0, 0, pad)) if pad else self.prefix  # [B, nb*m, T]
            self._block_prefix = rows.view(B * nb, 1, m, T)
        eye = torch.eye(m, dtype=torch.bool, device=q.device).repeat(1, s)  # [m, s*m]
        mask = torch.cat([self._block_prefix, eye.expand(B * nb, 1, m, s * m)], dim=-1)  # [B*nb, 1, m, T+s*m]
        out = F.scaled_dot_product_attention(
            blocks(q), keys(self.key0, self.keys), keys(self.value0, self.values), attn_mask=mask
        )  # [B*nb, nh, m, hd]
        out = out.view(B, nb, nh, m, hd).transpose(1, 2).reshape(B, nh, nb * m, hd)
        return out[:, :, :T] if pad else out


def ttt_unroll(
    draft: Eagle3Draft,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    doc_ids: torch.Tensor,
    aux: torch.Tensor,
    num_steps: int,
    *,
    logits: bool = True,
    forward: Callable[..., DraftOutput] | None = None,
    attention: TTTAttention = "blocked",
) -> Iterator[DraftOutput]:
    """Yield the draft's output for steps 0..num_steps-1.

    input_ids, positions, doc_ids [B, T] (positions restart per record, doc_ids = -1 on padding),
    aux [B, T, A*Ht]. Each yielded DraftOutput has hidden [B, T, H] and logits [B, T, Vd]; row t
    of step s predicts x[t+2+s] (see the module docstring). Rows whose shifted inputs leave their
    record produce values that no in-range row ever attends to; mask them with `step_in_range`.
    logits=False leaves `DraftOutput.logits` empty (apply `draft.compute_logits` to the rows needed).
    forward: what runs each step in place of `draft` itself (its compiled forward).
    attention: "blocked" (`_ChainKeys`, any device) or "flex" (`ttt_flex.FlexChainKeys`: block-sparse,
    CUDA for training; both compute the same mask).
    """
    hidden = draft.project(aux)  # [B, T, H]
    chain: _ChainKeys | FlexChainKeys
    if attention == "flex":
        chain = FlexChainKeys(doc_ids, num_steps)
    elif attention == "blocked":
        chain = _ChainKeys(prefix_mask(doc_ids))  # [B, T, T]
    else:
        raise ValueError(f"ttt attention: expected 'blocked' or 'flex', got {attention!r}")
    step = forward if forward is not None else draft
    for s in range(num_steps):
        out = step(shift_left(input_ids, 1 + s), hidden, positions + s, kv=chain, compute_logits=logits)
        yield out
        hidden = out.hidden
