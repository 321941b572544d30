"""The compact Llama-family forward, written as plain tensor functions.

Three pure functions make one forward; none of them synchronises with the host, so the whole
forward can be captured in a CUDA graph, and each can be compiled (one compiled layer function
serves every layer: the weights are arguments, not attributes):

    prepare(...)   rotary cos/sin, the cache slots of the new tokens, the additive attention mask
    layer(...)     one decoder layer; it also writes the new tokens' K/V into the static cache
    head(...)      final norm + lm_head in float32 logits

The residual stream is carried as (h, delta) with h + delta = the layer's input; each layer does
the add itself so it fuses with its RMSNorm, and returns its input (boundary b) for capture.

Attention over the cache: new token i of row b sees cache slots s < lengths[b] (the committed
prefix) and slot lengths[b] + j when tree_mask[b, i, j] (the new tokens are written provisionally
right after the prefix). GQA folds the G query heads of a KV head into the query axis, so K/V are
never repeated: q [B, Hkv, G*N, hd] against k [B, Hkv, S, hd].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from eaglewire.engine.runners.fast.weights import ModelSpec
from eaglewire.nn.rope import apply_rope
from eaglewire.nn.triton_kernels import triton_kernels_run_on


@dataclass(frozen=True)
class KernelChoices:
    """How the compiled (decode/verify) forward computes its small pieces. rows = B*N tokens.

    Optionally a matrix product with few rows and a small weight is written as a fused
    multiply-reduce (one Triton kernel that also absorbs its pointwise producer), and attention for
    few rows as three fused reductions. Measured on an H200 (benchmarks/ENGINE_NOTES.md) both lose
    to cuBLAS and SDPA, so they are off by default. Only for compiled code: eagerly these forms
    would materialise [rows, N, K] products."""

    reduction_matmul_max_rows: int = 0
    reduction_matmul_max_bytes: int = 0
    reduction_attention_max_rows: int = 0
    sdpa_backend: str | None = None  # "efficient" | "flash" | "cudnn" | "math"; None: PyTorch picks
    # "triton": attention over the cache as one Triton kernel (`runtime.attention_triton`, CUDA)
    # for forwards of at most triton_attention_max_rows query rows per KV head (G*N; None: all),
    # SDPA above; "sdpa": F.scaled_dot_product_attention on the grouped queries always; "auto":
    # `KernelChoices.resolved` picks
    attention: str = "auto"
    triton_attention_max_rows: int | None = None

    def resolved(self, device: torch.device) -> KernelChoices:
        """These choices with "auto" made for `device`: on CUDA the Triton kernel for decode-sized
        forwards (at most TRITON_ATTENTION_MAX_ROWS query rows a KV head) and SDPA above; SDPA
        elsewhere (Triton kernels need a GPU, and Triton). A whole compiled, graphed forward with it equals the
        SDPA forward on the H200 (tests/gpu/test_cache_attention_cuda.py), and so does greedy
        decoding through it (tests/gpu/test_launch_ahead_cuda.py)."""
        if self.attention != "auto":
            return self
        if triton_kernels_run_on(device):
            return dataclasses.replace(
                self, attention="triton", triton_attention_max_rows=TRITON_ATTENTION_MAX_ROWS
            )
        return dataclasses.replace(self, attention="sdpa")


# Measured on an H200 (SmolLM2 shape, benchmarks/round_kernels.py, docs/history/benchmarks-log.md §2r):
# the Triton kernel takes a decode step from 1.21 to 1.11 ms (a 256-row batched step from 2.51 to 2.21 ms);
# for a 128-node tree (384 rows a KV head) it lost to cuDNN (1.51 against 1.47 ms), at 18 rows they
# tie. So the Triton choice should serve decode-sized forwards only: this many rows a KV head.
TRITON_ATTENTION_MAX_ROWS = 16


EAGER_KERNELS = KernelChoices(attention="sdpa")
SDPA_BACKENDS = {
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, kc: KernelChoices) -> torch.Tensor:
    """x [B, N, K] @ w[out, K].T (+ b), float32 accumulation either way."""
    rows = x.shape[0] * x.shape[1]
    if rows <= kc.reduction_matmul_max_rows and w.numel() * w.element_size() <= kc.reduction_matmul_max_bytes:
        y = (x.float().unsqueeze(-2) * w.float()).sum(-1)  # [B, N, out]
        if b is not None:
            y = y + b.float()
        return y.to(x.dtype)
    return F.linear(x, w, b)


def attention_reduce(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """q [B, Hkv, R, hd], keys/values [B, Hkv, S, hd], mask [B, 1, R, S] additive -> [B, Hkv, R, hd]."""
    scale = q.shape[-1] ** -0.5
    scores = (q.float().unsqueeze(-2) * keys.float().unsqueeze(-3)).sum(
        -1
    ) * scale + mask.float()  # [B, Hkv, R, S]
    probs = torch.softmax(scores, dim=-1)
    return (probs.unsqueeze(-1) * values.float().unsqueeze(-3)).sum(-2).to(q.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As eaglewire.nn.rmsnorm.RMSNorm (and HF Llama): statistics in float32, scale in x's dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def prepare(
    positions: torch.Tensor,
    lengths: torch.Tensor,
    tree_mask: torch.Tensor | None,
    kv_positions: torch.Tensor | None,
    inv_freq: torch.Tensor,
    rope_scaling: float,
    group_size: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """positions [B, N]; lengths [B] committed per row; tree_mask [B, N, N] bool or None (causal);
    kv_positions [S] = arange(S), the cache slots attended to, or None for a prefill of empty rows
    (attention among the new tokens only, causal).

    Returns cos, sin [B, 1, N, hd]; write_slots [B, N] (cache slot of each new token);
    mask [B, 1, G*N, S] additive in `dtype`, or None.
    """
    B, N = positions.shape
    freqs = positions.float()[..., None] * inv_freq  # [B, N, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, N, hd]
    cos = (emb.cos() * rope_scaling).to(dtype)[:, None]
    sin = (emb.sin() * rope_scaling).to(dtype)[:, None]
    new_idx = torch.arange(N, device=positions.device)
    write_slots = lengths[:, None] + new_idx  # [B, N]
    if kv_positions is None:
        return cos, sin, write_slots, None
    S = kv_positions.shape[0]
    if tree_mask is None:
        tree = (new_idx[:, None] >= new_idx[None, :])[None].expand(B, N, N)  # causal
    else:
        tree = tree_mask.to(torch.bool)
    tree = tree | torch.eye(N, dtype=torch.bool, device=positions.device)  # a token always sees itself
    rel = kv_positions[None, :] - lengths[:, None]  # [B, S] slot relative to the first new token
    committed = rel < 0
    in_new = (rel >= 0) & (rel < N)
    seen_new = torch.gather(tree, 2, rel.clamp(0, N - 1)[:, None, :].expand(B, N, S))  # [B, N, S]
    allowed = committed[:, None, :] | (in_new[:, None, :] & seen_new)  # [B, N, S]
    zero = torch.zeros((), dtype=dtype, device=positions.device)
    neg = torch.full((), float("-inf"), dtype=dtype, device=positions.device)
    additive = torch.where(allowed, zero, neg)  # [B, N, S]
    mask = additive[:, None, None].expand(B, 1, group_size, N, S).reshape(B, 1, group_size * N, S)
    return cos, sin, write_slots, mask.contiguous()


def make_layer_fn(
    spec: ModelSpec, kc: KernelChoices = EAGER_KERNELS
) -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A function computing one decoder layer for `spec` (see `layer` below for its arguments)."""
    Hq, Hkv, hd, G = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.group_size
    eps, qk_norm = spec.rms_eps, spec.qk_norm
    inter = spec.intermediate_size
    if kc.attention not in ("sdpa", "triton"):
        raise ValueError(
            f"KernelChoices.attention: expected 'sdpa' or 'triton' (resolve 'auto' first), got {kc.attention!r}"
        )
    cache_attention = None
    if kc.attention == "triton":  # imported here, outside the traced layer
        from eaglewire.engine.runners.fast.attention_triton import cache_attention

    def layer(
        h: torch.Tensor,
        delta: torch.Tensor,
        input_norm: torch.Tensor,
        qkv_w: torch.Tensor,
        qkv_b: torch.Tensor | None,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        o_w: torch.Tensor,
        o_b: torch.Tensor | None,
        post_norm: torch.Tensor,
        gate_up_w: torch.Tensor,
        gate_up_b: torch.Tensor | None,
        down_w: torch.Tensor,
        down_b: torch.Tensor | None,
        kv_cache: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write_rows: torch.Tensor,
        write_slots: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h, delta [B, N, Ht] (layer input = h + delta); kv_cache [Bmax, 2*Hkv, Smax, hd] (keys then values);
        write_rows, write_slots [B, N]; mask [B, 1, G*N, S] or None (prefill: causal, new tokens only).
        Returns (x, x2, mlp_out): x = this layer's input (its boundary state), x2 + mlp_out = output."""
        B, N, _ = h.shape
        x = h + delta
        qkv = linear(rms_norm(x, input_norm, eps), qkv_w, qkv_b, kc)  # [B, N, (Hq+2Hkv)*hd]
        q, k, v = qkv.split([Hq * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, N, Hq, hd)
        k = k.view(B, N, Hkv, hd)
        v = v.view(B, N, Hkv, hd)
        if qk_norm:
            assert q_norm is not None and k_norm is not None
            q = rms_norm(q, q_norm, eps)
            k = rms_norm(k, k_norm, eps)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, Hq, N, hd]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, Hkv, N, hd]
        v = v.transpose(1, 2)  # [B, Hkv, N, hd]
        kv_cache[write_rows, :, write_slots] = torch.cat([k, v], dim=1).transpose(1, 2)  # [B, N, 2Hkv, hd]
        max_rows = kc.triton_attention_max_rows
        if mask is not None and cache_attention is not None and (max_rows is None or max_rows >= G * N):
            attn = cache_attention(q, kv_cache, mask).view(B, N, Hq * hd)
        elif mask is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            attn = attn.transpose(1, 2).reshape(B, N, Hq * hd)
        else:
            S = mask.shape[-1]
            qg = q.reshape(B, Hkv, G * N, hd)  # query heads of one KV head side by side
            keys, values = kv_cache[:B, :Hkv, :S], kv_cache[:B, Hkv:, :S]  # [B, Hkv, S, hd] each
            if kc.reduction_attention_max_rows >= B * N:
                attn = attention_reduce(qg, keys, values, mask)
            elif kc.sdpa_backend is not None:
                with sdpa_kernel([SDPA_BACKENDS[kc.sdpa_backend]]):
                    attn = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
            else:
                attn = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
            attn = attn.reshape(B, Hq, N, hd)  # backends differ in output layout
            attn = attn.transpose(1, 2).reshape(B, N, Hq * hd)
        x2 = x + linear(attn, o_w, o_b, kc)
        gate_up = linear(rms_norm(x2, post_norm, eps), gate_up_w, gate_up_b, kc)  # [B, N, 2I]
        gate, up = gate_up.split([inter, inter], dim=-1)
        mlp_out = linear(F.silu(gate) * up, down_w, down_b, kc)
        return x, x2, mlp_out

    return layer


def make_head_fn(spec: ModelSpec) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    eps = spec.rms_eps

    def head(
        h: torch.Tensor,
        delta: torch.Tensor,
        final_norm: torch.Tensor,
        lm_head: torch.Tensor,
        logits_at: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h, delta [B, N, Ht]; logits_at [B] index into N or None (all tokens).
        Returns (final pre-norm state [B, N, Ht] = boundary L, logits float32 [B, N or 1, V])."""
        final = h + delta
        sel = final
        if logits_at is not None:
            idx = logits_at.view(-1, 1, 1).expand(final.shape[0], 1, final.shape[2])
            sel = torch.gather(final, 1, idx)  # [B, 1, Ht]
        logits = F.linear(rms_norm(sel, final_norm, eps), lm_head).float()
        return final, logits

    return head
