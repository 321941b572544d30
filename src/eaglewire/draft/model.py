"""The EAGLE-3 draft model: one definition used by training, the engine and export.

    aux [B, T, A*Ht] --fc--> hidden [B, T, H]          (first step only; later steps feed the
                                                         draft's own pre-norm output back)
    embeds = embed_tokens(input_ids)                     [B, T, H]
    x = cat(input_layernorm(embeds), hidden_norm(hidden)) [B, T, 2H]   -> attention (2H wide in)
    h = hidden + attn(x);  h = h + mlp(post_attention_layernorm(h))     (pre-norm output, fed back)
    logits = lm_head(norm(h))                            [B, T, Vd]

Draft token `d` is target token `draft_to_target[d]` (absolute ids; the engines' offset form
`d2t` exists only in export/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from eaglewire.draft.config import DraftConfig
from eaglewire.nn.rmsnorm import RMSNorm
from eaglewire.nn.rope import apply_rope, rope_cos_sin, rope_inv_freq
from eaglewire.nn.stacked import stack_in_place


class DraftKV(Protocol):
    """Where the draft layer's keys/values live between calls, and how new queries attend to them
    (training: growing, or the TTT chain of `eaglewire.train.ttt`; engine: static)."""

    def attend(
        self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Store new key/value [B, nkv, T, hd]; return q [B, nh, T, hd] attended over every stored
        key [B, nh, T, hd]. mask: bool [T, S] or [B, 1, T, S] over the stored keys, None = causal."""
        ...


def attend(
    q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """q [B, nh, T, hd] over key/value [B, nkv, S, hd] (grouped KV heads); mask None = causal, the T
    queries being the last T of the S keys."""
    T, S = q.shape[2], key.shape[2]
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
    return F.scaled_dot_product_attention(
        q, key, value, attn_mask=mask, enable_gqa=key.shape[1] != q.shape[1]
    )


class GrowingKV:
    """The simplest DraftKV: concatenates along the sequence axis."""

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None

    def append(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.key = key if self.key is None else torch.cat([self.key, key], dim=2)
        self.value = value if self.value is None else torch.cat([self.value, value], dim=2)
        return self.key, self.value

    def attend(
        self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        return attend(q, *self.append(key, value), mask)

    @property
    def length(self) -> int:
        return 0 if self.key is None else int(self.key.shape[2])


@dataclass
class DraftOutput:
    hidden: torch.Tensor  # [B, T, H] pre-norm output: the next step's `hidden` input
    logits: torch.Tensor  # [B, T, Vd]


class StackedLinears(nn.Module):
    """A module that multiplies some of its linears (`stacked_linears`, bias-free) as one matrix.

    Training concatenates their weights in every forward (the product must reach the parameters).
    For inference, `fuse_weights` stacks them once into the non-persistent buffer `stacked` and
    makes each weight a view of its rows: the same values, parameters and state dict, one copy in
    memory, and no weight copy per forward. Whatever replaces the weights afterwards (`.to()`, a
    load with assign=True) stacks them again, so the buffer never goes stale; in-place loads write
    through the views."""

    stacked_linears: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.stacked: torch.Tensor | None
        self.register_buffer("stacked", None, persistent=False)
        self.register_load_state_dict_post_hook(_restack_after_load)  # a function: modules stay picklable

    def linears(self) -> list[nn.Linear]:
        return [getattr(self, name) for name in self.stacked_linears]

    def fuse_weights(self) -> None:
        if self.stacked is None:  # once: CUDA graphs captured since read this very tensor
            self._stack()

    def stacked_weight(self) -> torch.Tensor:
        """[sum of out_features, in_features]: the buffer when inferring, else a concatenation."""
        if self.stacked is not None and not torch.is_grad_enabled():
            return self.stacked
        return torch.cat([m.weight for m in self.linears()])

    def _stack(self) -> None:
        self.stacked = stack_in_place(self.linears())

    def _restack(self) -> None:
        if self.stacked is not None and self.linears()[0].weight.data_ptr() != self.stacked.data_ptr():
            self._stack()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
        super()._apply(fn, recurse)
        if self.stacked is not None:  # each tensor was converted apart: stack again
            self._stack()
        return self


def _restack_after_load(module: nn.Module, _keys: object) -> None:
    assert isinstance(module, StackedLinears)
    module._restack()


class DraftAttention(StackedLinears):
    stacked_linears = ("q_proj", "k_proj", "v_proj")

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        wide = 2 * cfg.hidden_size  # attention reads cat(embeds, hidden)
        self.q_proj = nn.Linear(wide, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(wide, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(wide, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: DraftKV | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # One matrix product for q, k and v: a drafting step has ~8 rows, so each product costs a
        # kernel's latency or its weight bytes. The tensor names stay q/k/v_proj.
        q, k, v = F.linear(x, self.stacked_weight()).split([q_width, kv_width, kv_width], dim=-1)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        k = k.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, nkv, T, hd]
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q, k, v, mask) if kv is None else kv.attend(q, k, v, mask)  # [B, nh, T, hd]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class DraftMLP(StackedLinears):
    stacked_linears = ("gate_proj", "up_proj")  # one product, as q/k/v in DraftAttention

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.stacked_weight()).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: DraftKV | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # [B, T, 2H]
        h = hidden + self.self_attn(x, cos, sin, kv, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.fc = nn.Linear(cfg.aux_width, cfg.hidden_size, bias=False)
        self.layer = DraftLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # Identity map until a vocabulary is chosen (valid only when Vd == V; init checks that).
        self.register_buffer("draft_to_target", torch.arange(cfg.draft_vocab_size, dtype=torch.long))
        inv_freq, scaling = rope_inv_freq(cfg.rope_parameters, cfg.head_dim, cfg.max_position_embeddings)
        # A plain attribute, not a buffer: `.to(bfloat16)` must not round the frequencies.
        self.rope_inv_freq = inv_freq
        self.rope_scaling = scaling

    def fuse_weights(self) -> None:
        """For inference (the engine's Drafter calls it): q/k/v and gate/up each become views of one
        stacked weight (`StackedLinears`), so a drafting forward reads its weights once instead of
        concatenating them first: a copy of 336 MB per step at the Llama-3.1-8B shape, where a
        chain step went from 0.52 to 0.32 ms on an H100 (log §2zg). Idempotent: a second call
        (another Drafter of the same draft) must not free the tensor the first one's graphs read."""
        self.layer.self_attn.fuse_weights()
        self.layer.mlp.fuse_weights()

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [B, T, A*Ht] -> hidden [B, T, H]."""
        if aux.shape[-1] != self.config.aux_width:
            raise ValueError(
                f"aux states are {aux.shape[-1]} wide, the draft's fc expects A*Ht = "
                f"{self.config.num_aux}*{self.config.target_hidden_size} = {self.config.aux_width}"
            )
        return self.fc(aux)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rope_inv_freq.device != positions.device:
            # moved once, outside any CUDA graph capture: a host-to-device copy cannot be captured
            self.rope_inv_freq = self.rope_inv_freq.to(positions.device)
        return rope_cos_sin(self.rope_inv_freq, positions, self.rope_scaling, dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """pre-norm hidden [..., H] -> draft logits [..., Vd]."""
        return self.lm_head(self.norm(hidden))

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        *,
        kv: DraftKV | None = None,
        mask: torch.Tensor | None = None,
        compute_logits: bool = True,
    ) -> DraftOutput:
        """One draft step.

        input_ids [B, T] (the tokens whose embeddings pair with `hidden`), hidden [B, T, H] (fc
        output of target aux states, or the previous step's pre-norm output), positions [B, T].
        mask: bool [T, S] or [B, 1, T, S], True = attend, S = keys after appending; None = causal.
        """
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        cos, sin = self.rope(positions, hidden.dtype)
        out = self.layer(embeds, hidden, cos, sin, kv, mask)  # [B, T, H]
        logits = self.compute_logits(out) if compute_logits else out.new_empty(0)
        return DraftOutput(hidden=out, logits=logits)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.get_buffer("draft_to_target")[draft_ids]
