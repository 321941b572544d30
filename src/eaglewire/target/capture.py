"""Hook-based capture of boundary states from any supported Hugging Face target.

Boundary `b < L` is the input of decoder layer `b` (a forward pre-hook on `layers[b]`), so it
is exactly what the model feeds that layer, embedding scaling included. Boundary `L` pre-norm
is the input of the final norm; post-norm is its output. Tests pin that these equal
`output_hidden_states[b]` (b < L) and that HF's last entry is the post-norm state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from eaglewire.contract.contract import FinalState
from eaglewire.contract.fingerprint import StateKey
from eaglewire.contract.numbering import all_boundaries
from eaglewire.nn.attention import varying_shape_attention
from eaglewire.target.architectures import target_parts


@dataclass
class CapturedStates:
    """What the draft consumes from one target forward."""

    aux: torch.Tensor  # [B, T, A*Ht] aux states concatenated in contract order
    final: torch.Tensor  # [B, T, Ht] the contract's final state
    logits: torch.Tensor | None = None  # [B, T, V] when asked for


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return kwargs["hidden_states"]


@contextmanager
def hooked_states(model: nn.Module, keys: Sequence[StateKey]) -> Iterator[dict[StateKey, torch.Tensor]]:
    """Register hooks for `keys`; the yielded dict fills with [B, T, Ht] tensors on each forward."""
    parts = target_parts(model)
    L = parts.num_layers
    store: dict[StateKey, torch.Tensor] = {}
    handles = []

    def pre_hook(key: StateKey) -> Any:
        def fn(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            store[key] = _first_tensor(args, kwargs)

        return fn

    def post_hook(key: StateKey) -> Any:
        def fn(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            store[key] = output[0] if isinstance(output, tuple) else output

        return fn

    for key in keys:
        if not 0 <= key.boundary <= L:
            raise ValueError(f"boundary {key.boundary} out of range 0..{L}")
        if key.norm == "post":
            if key.boundary != L:
                raise ValueError(f"post-norm state exists only at boundary L={L}, got {key.boundary}")
            handles.append(parts.final_norm.register_forward_hook(post_hook(key)))
        elif key.boundary < L:
            handles.append(
                parts.layers[key.boundary].register_forward_pre_hook(pre_hook(key), with_kwargs=True)
            )
        else:
            handles.append(parts.final_norm.register_forward_pre_hook(pre_hook(key), with_kwargs=True))
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def mla_modules(model: nn.Module) -> list[Any]:
    """The multi-head latent attention modules (DeepSeek-V3) whose K/V groups `mla_heads_fixed` sets."""
    return [
        m for m in model.modules() if hasattr(m, "expand_kv") and getattr(m, "num_key_value_groups", 1) != 1
    ]


@contextmanager
def mla_heads_fixed(modules: Sequence[Any]) -> Iterator[None]:
    """transformers' multi-head latent attention (DeepSeek-V3) expands K/V to all query heads
    itself, yet its path for a custom attention mask repeats them again by `num_key_value_groups`
    when a config has num_key_value_heads < num_attention_heads (a shape error). Inside the block
    the groups of `modules` (`mla_modules(model)`) are 1; other architectures have none."""
    saved = [(m, int(m.num_key_value_groups)) for m in modules]
    for m, _ in saved:
        m.num_key_value_groups = 1
    try:
        yield
    finally:
        for m, groups in saved:
            m.num_key_value_groups = groups


def _run(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    logits: bool,
) -> Any:
    # The base model skips the lm_head: capture without logits costs no [B, T, V] matmul.
    run = model if logits else model.model
    return run(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)


@torch.no_grad()
def capture(
    model: nn.Module,
    input_ids: torch.Tensor,
    *,
    aux_boundaries: Sequence[int],
    final: FinalState,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    return_logits: bool = False,
) -> CapturedStates:
    """Run the target on `input_ids` [B, T] and return the contract's states. attention_mask: [B, T]
    padding mask, or a custom [B, 1, T, T] additive one (packed records); position_ids [B, T]."""
    aux_keys = [StateKey(b, "pre") for b in aux_boundaries]
    final_key = StateKey(final.boundary, final.norm)
    keys = list(dict.fromkeys([*aux_keys, final_key]))
    # each batch has its own shape: no per-shape cuDNN plans
    with hooked_states(model, keys) as store, varying_shape_attention(), mla_heads_fixed(mla_modules(model)):
        out = _run(model, input_ids, attention_mask, position_ids, return_logits)
    aux = torch.cat([store[k] for k in aux_keys], dim=-1)  # [B, T, A*Ht]
    return CapturedStates(aux=aux, final=store[final_key], logits=out.logits if return_logits else None)


def all_state_keys(num_layers: int) -> list[StateKey]:
    """Every boundary 0..L pre-norm plus the post-norm final state."""
    return [StateKey(b, "pre") for b in all_boundaries(num_layers)] + [StateKey(num_layers, "post")]


@torch.no_grad()
def capture_all(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> dict[StateKey, torch.Tensor]:
    """Every boundary (and the post-norm final) for `input_ids` [B, T]: key -> [B, T, Ht]."""
    keys = all_state_keys(target_parts(model).num_layers)
    with hooked_states(model, keys) as store:
        _run(model, input_ids, attention_mask, None, logits=False)
    return dict(store)
