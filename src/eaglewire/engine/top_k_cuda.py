"""The drafter's top-k with log-probabilities as two Triton kernels (CUDA only; imported on demand).

Each draft step needs, for R frontier rows of Vd logits, the k best draft ids and their
log-probabilities. Written with torch ops that is a chunked `topk` (gatherTopK + a bitonic sort
per call), a second `topk`, and a logsumexp of two or three reductions: on an H200 about 40 us
per step, 39% of an 8-step top-8 round's kernel time (benchmarks/round_kernels.py).
Here:

    _chunk_top_k   grid (R, C): each program takes one BLOCK-wide chunk of a row, writes the
                   chunk's max and sum of exp(x - max) (for the logsumexp) and its k best
                   (value, id), found by k rounds of max-and-knock-out in registers
    _merge_top_k   grid (R,): combines the C chunk statistics into the row's logsumexp and picks
                   the k best of the C*k candidates the same way

Order: largest first; equal values by lower id (a stable descending sort's order), since each
max takes the first of equal entries and candidates lie chunk by chunk in id order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

BLOCK = 1024  # ids per chunk: 16 chunks for a 16k draft vocabulary


@triton.jit
def _chunk_top_k(
    x_ptr,
    stride_row,
    V,
    cand_val_ptr,
    cand_id_ptr,
    chunk_max_ptr,
    chunk_sum_ptr,
    C,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    ids = chunk * BLOCK + offs
    x = tl.load(x_ptr + row * stride_row + ids, mask=ids < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(chunk_max_ptr + row * C + chunk, m)
    tl.store(chunk_sum_ptr + row * C + chunk, tl.sum(tl.exp(x - m), axis=0))
    base = (row * C + chunk) * K
    for i in tl.static_range(K):
        best, at = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(cand_val_ptr + base + i, best)
        tl.store(cand_id_ptr + base + i, chunk * BLOCK + at)
        x = tl.where(offs == at, float("-inf"), x)


@triton.jit
def _merge_top_k(
    cand_val_ptr,
    cand_id_ptr,
    chunk_max_ptr,
    chunk_sum_ptr,
    out_id_ptr,
    out_logp_ptr,
    C,
    K: tl.constexpr,
    C_POW2: tl.constexpr,
    CK_POW2: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, C_POW2)
    m = tl.load(chunk_max_ptr + row * C + c, mask=c < C, other=float("-inf"))
    s = tl.load(chunk_sum_ptr + row * C + c, mask=c < C, other=0.0)
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(s * tl.exp(m - top), axis=0))
    j = tl.arange(0, CK_POW2)
    vals = tl.load(cand_val_ptr + row * C * K + j, mask=j < C * K, other=float("-inf"))
    ids = tl.load(cand_id_ptr + row * C * K + j, mask=j < C * K, other=0)
    for i in tl.static_range(K):
        best, at = tl.max(vals, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(out_logp_ptr + row * K + i, best - lse)
        tl.store(out_id_ptr + row * K + i, tl.sum(tl.where(j == at, ids, 0), axis=0))
        vals = tl.where(j == at, float("-inf"), vals)


def fused_top_k_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] (any float dtype) -> (ids [R, k] int64, log-probs [R, k] float32): the k most
    likely ids of each row, largest first, equal values by lower id."""
    return _top_k_log_probs(logits.contiguous(), k)


@triton_op("eaglewire::top_k_log_probs", mutates_args=())
def _top_k_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fused_top_k_log_probs on rows that are contiguous."""
    R, V = logits.shape
    C = triton.cdiv(V, BLOCK)
    dev = logits.device
    cand_val = torch.empty(R, C, k, dtype=torch.float32, device=dev)
    cand_id = torch.empty(R, C, k, dtype=torch.int64, device=dev)
    chunk_max = torch.empty(R, C, dtype=torch.float32, device=dev)
    chunk_sum = torch.empty(R, C, dtype=torch.float32, device=dev)
    wrap_triton(_chunk_top_k)[(R, C)](
        logits, logits.stride(0), V, cand_val, cand_id, chunk_max, chunk_sum, C, K=k, BLOCK=BLOCK
    )
    ids = torch.empty(R, k, dtype=torch.int64, device=dev)
    logp = torch.empty(R, k, dtype=torch.float32, device=dev)
    wrap_triton(_merge_top_k)[(R,)](
        cand_val,
        cand_id,
        chunk_max,
        chunk_sum,
        ids,
        logp,
        C,
        K=k,
        C_POW2=triton.next_power_of_2(C),
        CK_POW2=triton.next_power_of_2(C * k),
    )
    return ids, logp
