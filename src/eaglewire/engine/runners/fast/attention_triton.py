"""Attention over the static KV cache as one Triton kernel (CUDA only; imported on demand by
`make_layer_fn` when `KernelChoices.attention` is "triton").

What it replaces, per layer of a decode or verify forward (benchmarks/round_kernels.py, H200,
SmolLM2 shape): a copy of q into the grouped layout, a memset, cuDNN's fused attention
(8.9 us for one token, 9.8 us for a 128-node tree) and a transposed copy of its output.

One program per (row, KV head, block of BLOCK_M query rows); the query rows of a KV head are its
G query heads' tokens, row r = g * N + n (the layout of the runtime's additive mask [B, 1, G*N, S]).
Keys and values are read straight from the cache [Bmax, 2*Hkv, Smax, hd] in BLOCK_N-slot tiles
with an online softmax (float32 statistics, probabilities cast to the value dtype for the second
product, as flash attention does); the additive mask is added to each tile's scores. The output
is written as [B, N, Hq, hd], the layout o_proj reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def _cache_attention(
    q_ptr,
    sq_b,
    sq_h,
    sq_n,
    sq_d,
    kv_ptr,
    skv_b,
    skv_h,
    skv_s,
    skv_d,
    mask_ptr,
    sm_b,
    sm_r,
    out_ptr,
    so_b,
    so_n,
    so_h,
    N,
    S,
    SCALE: tl.constexpr,  # a constexpr: a float argument is float64 under torch.compile's launcher
    HKV: tl.constexpr,
    G: tl.constexpr,
    HD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    b = tl.program_id(0) // HKV
    kvh = tl.program_id(0) % HKV
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM] r = g * N + n
    row_ok = rows < G * N
    head = kvh * G + rows // N
    n = rows % N
    d = tl.arange(0, HD)
    q = tl.load(
        q_ptr + b * sq_b + head[:, None] * sq_h + n[:, None] * sq_n + d[None, :] * sq_d,
        mask=row_ok[:, None],
        other=0.0,
    )  # [BM, HD]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD], tl.float32)
    k_base = kv_ptr + b * skv_b + kvh * skv_h
    v_base = kv_ptr + b * skv_b + (HKV + kvh) * skv_h
    for start in range(0, S, BLOCK_N):
        s = start + tl.arange(0, BLOCK_N)
        s_ok = s < S
        k = tl.load(k_base + s[:, None] * skv_s + d[None, :] * skv_d, mask=s_ok[:, None], other=0.0)
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        bias = tl.load(
            mask_ptr + b * sm_b + rows[:, None] * sm_r + s[None, :],
            mask=row_ok[:, None] & s_ok[None, :],
            other=float("-inf"),
        ).to(tl.float32)
        qk = qk * SCALE + bias  # [BM, BN]
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp(qk - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + s[:, None] * skv_s + d[None, :] * skv_d, mask=s_ok[:, None], other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + b * so_b + n[:, None] * so_n + head[:, None] * so_h + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


@triton_op("eaglewire::cache_attention", mutates_args=())
def cache_attention(q: torch.Tensor, kv_cache: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, N, hd] (rotated); kv_cache [Bmax, 2*Hkv, Smax, hd] (keys then values, the new
    tokens already written); mask [B, 1, G*N, S] additive (0 / -inf), S the attended slots.
    Returns the attention output [B, N, Hq, hd] (softmax scale hd**-0.5)."""
    B, Hq, N, hd = q.shape
    Hkv = kv_cache.shape[1] // 2
    G = Hq // Hkv
    S = mask.shape[-1]
    out = torch.empty(B, N, Hq, hd, dtype=q.dtype, device=q.device)
    rows = G * N
    block_m = 16 if rows <= 16 else 64
    block_n = 128 if rows <= 16 else 64
    wrap_triton(_cache_attention)[(B * Hkv, triton.cdiv(rows, block_m))](
        q,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        q.stride(3),
        kv_cache,
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        mask,
        mask.stride(0),
        mask.stride(2),
        out,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        N,
        S,
        SCALE=hd**-0.5,
        HKV=Hkv,
        G=G,
        HD=hd,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32,
    )
    return out
