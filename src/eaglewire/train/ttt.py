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

Keys accumulate in one `GrowingKV` in step order, so at step s there are (s+1)*T keys:
block j holds step j's keys for rows 0..T-1.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from eaglewire.draft.model import DraftOutput, Eagle3Draft, GrowingKV


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
    """The mask of TTT step `step` over all keys so far: bool [B, 1, T, (step+1)*T], True = attend."""
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


def ttt_unroll(
    draft: Eagle3Draft,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    doc_ids: torch.Tensor,
    aux: torch.Tensor,
    num_steps: int,
) -> Iterator[DraftOutput]:
    """Yield the draft's output for steps 0..num_steps-1.

    input_ids, positions, doc_ids [B, T] (positions restart per record, doc_ids = -1 on padding),
    aux [B, T, A*Ht]. Each yielded DraftOutput has hidden [B, T, H] and logits [B, T, Vd]; row t
    of step s predicts x[t+2+s] (see the module docstring). Rows whose shifted inputs leave their
    record produce values that no in-range row ever attends to; mask them with `step_in_range`.
    """
    hidden = draft.project(aux)  # [B, T, H]
    kv = GrowingKV()
    prefix = prefix_mask(doc_ids)
    for s in range(num_steps):
        out = draft(
            shift_left(input_ids, 1 + s),
            hidden,
            positions + s,
            kv=kv,
            mask=ttt_attention_mask(doc_ids, s, prefix),
        )
        yield out
        hidden = out.hidden
