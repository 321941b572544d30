"""Hugging Face transformers baselines, batch 1, greedy: what a user gets without eaglewire.

| method               | call                                                                        |
|----------------------|-----------------------------------------------------------------------------|
| `hf-generate`        | `model.generate(ids, do_sample=False)` (dynamic cache, eager)               |
| `hf-prompt-lookup`   | the same with `prompt_lookup_num_tokens=N` (n-gram drafts from the prompt)   |
| `hf-static-compiled` | the same with `cache_implementation="static"` (auto-compiled decode step)    |

transformers auto-compiles the decode step only on CUDA/XPU/TPU with a compileable cache
(`GenerationMixin._valid_auto_compile_criteria` in transformers 5.17 `generation/utils.py`), so
`hf-static-compiled` is reported "not available" elsewhere, and also when the warm-up call raises
or finishes without a compiled call (`model._compiled_call` absent): the reason is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

HF_METHODS = ("hf-generate", "hf-prompt-lookup", "hf-static-compiled")
DEFAULT_PROMPT_LOOKUP_TOKENS = 10


@dataclass
class HFBaseline:
    """A greedy transformers `generate` configuration over one loaded model (batch 1)."""

    name: str
    model: Any
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    extra: dict[str, Any]

    @torch.no_grad()
    def __call__(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Generated token ids (prompt excluded; ending with the eos token when one was produced)."""
        device = next(self.model.parameters()).device
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # [1, T]
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=list(self.eos_token_ids) or None,
            pad_token_id=self.pad_token_id,
            **self.extra,
        )
        return trim_after_eos(out[0, ids.shape[1] :].tolist(), self.eos_token_ids)


def trim_after_eos(tokens: list[int], eos_token_ids: Sequence[int]) -> list[int]:
    """Cut after the first eos (kept), as eaglewire's decoders return it."""
    eos = set(eos_token_ids)
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def _pad_id(model: Any, eos_token_ids: Sequence[int]) -> int | None:
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = getattr(model.config, "pad_token_id", None)
    if pad is None and eos_token_ids:
        pad = eos_token_ids[0]
    return None if pad is None else int(pad)


def make_hf_baseline(
    name: str,
    model: Any,
    eos_token_ids: Sequence[int],
    *,
    prompt_lookup_num_tokens: int = DEFAULT_PROMPT_LOOKUP_TOKENS,
) -> HFBaseline:
    """One of HF_METHODS over `model`. Availability of hf-static-compiled: see `static_compiled_unavailable`."""
    extra: dict[str, Any] = {}
    if name == "hf-prompt-lookup":
        extra["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    elif name == "hf-static-compiled":
        extra["cache_implementation"] = "static"  # transformers then compiles with its default CompileConfig
    elif name != "hf-generate":
        raise ValueError(f"unknown HF baseline {name!r}; known: {', '.join(HF_METHODS)}")
    eos = tuple(int(e) for e in eos_token_ids)
    return HFBaseline(name, model, eos, _pad_id(model, eos), extra)


def static_compiled_unavailable(model: Any) -> str | None:
    """Why `hf-static-compiled` cannot run on this model/device before trying it (None = try it)."""
    device = next(model.parameters()).device
    if device.type not in ("cuda", "xpu"):
        return (
            f"needs a CUDA/XPU device (the model is on {device.type}): transformers auto-compiles a "
            "static-cache decode only there (generation/utils.py _valid_auto_compile_criteria)"
        )
    return None


def check_compiled(model: Any) -> str | None:
    """After a warm-up of hf-static-compiled: None if a compiled call exists, else why not."""
    if hasattr(model, "_compiled_call"):
        return None
    return "transformers ran the static cache without compiling (auto-compile criteria not met)"
