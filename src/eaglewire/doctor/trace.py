"""`doctor --trace`: every tensor crossing the target -> draft boundary for one prompt, stage by stage.

What the field reports added by hand as EAGLE3_DEBUG prints (shapes, norms, leading values at each
stage), built in: the target's forward with the contract's aux boundaries captured, each aux
column and their concatenation, the final state and the target's next token, the draft's fc
output, then a chain of draft steps (step 0 over the whole prompt; later steps feed back the
draft's own pre-norm hidden state with the previous draft token). Each stage is one JSON-able
dict; `trace_text` renders them as lines.

TODO: switch to the engine's own tracing hook when `eaglewire.engine` exposes one; until then
this runs the target and the draft directly, with the same capture and draft step code.
"""

from __future__ import annotations

from typing import Any

import torch

from eaglewire.contract.contract import Contract
from eaglewire.contract.numbering import describe_boundary
from eaglewire.draft.model import Eagle3Draft, GrowingKV
from eaglewire.errors import ConfigError
from eaglewire.target.capture import capture
from eaglewire.target.loading import LoadedTarget

LEADING_VALUES = 5
DEFAULT_TRACE_STEPS = 3


def tensor_stage(stage: str, name: str, x: torch.Tensor, **extra: Any) -> dict[str, Any]:
    """Shape, dtype, per-token L2 norms (mean and last token) and the last token's leading values."""
    xf = x.detach().float()
    entry: dict[str, Any] = {
        "stage": stage,
        "tensor": name,
        "shape": list(x.shape),
        "dtype": str(x.dtype).removeprefix("torch."),
    }
    if xf.is_floating_point() and xf.dim() >= 2 and x.is_floating_point():
        norms = xf.norm(dim=-1).reshape(-1)  # one per token
        entry["norm_mean"] = round(float(norms.mean()), 6)
        entry["norm_last"] = round(float(norms[-1]), 6)
        entry["leading_last"] = [
            round(float(v), 6) for v in xf.reshape(-1, xf.shape[-1])[-1, :LEADING_VALUES]
        ]
    else:
        entry["values_last"] = [int(v) for v in x.reshape(-1)[-LEADING_VALUES:]]
    entry.update(extra)
    return entry


def _encode(target: LoadedTarget, prompt: str) -> torch.Tensor:
    if target.tokenizer is None:
        raise ConfigError(f"target {target.path}: no tokenizer, so --prompt text cannot be encoded")
    tok = target.tokenizer
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tok(prompt, add_special_tokens=True)["input_ids"]
    return torch.tensor([list(ids)], dtype=torch.long)  # [1, T]


@torch.no_grad()
def run_trace(
    target: LoadedTarget,
    draft: Eagle3Draft,
    contract: Contract,
    prompt: str,
    *,
    num_steps: int = DEFAULT_TRACE_STEPS,
) -> list[dict[str, Any]]:
    """One prompt through target + draft (chain of `num_steps` draft tokens), every boundary tensor recorded."""
    L = target.num_layers
    ids = _encode(target, prompt).to(target.device)  # [1, T]
    T = ids.shape[1]
    stages: list[dict[str, Any]] = [tensor_stage("target.input", "input_ids", ids, text=prompt)]
    states = capture(
        target.model, ids, aux_boundaries=contract.aux_boundaries, final=contract.final, return_logits=True
    )
    ht = target.hidden_size
    for i, b in enumerate(contract.aux_boundaries):
        col = states.aux[..., i * ht : (i + 1) * ht]  # [1, T, Ht]
        stages.append(
            tensor_stage("target.capture", f"aux[{i}]", col, boundary=b, meaning=describe_boundary(b, L))
        )
    stages.append(
        tensor_stage(
            "target.capture",
            "aux (concatenated, fc input)",
            states.aux,
            boundaries=list(contract.aux_boundaries),
        )
    )
    stages.append(
        tensor_stage(
            "target.capture",
            "final",
            states.final,
            boundary=contract.final.boundary,
            norm=contract.final.norm,
        )
    )
    assert states.logits is not None
    next_token = states.logits[0, -1].float().argmax()
    stages.append(tensor_stage("target.logits", "logits", states.logits, next_token=int(next_token)))

    param = next(draft.parameters())
    hidden = draft.project(states.aux.to(param.device, param.dtype))  # [1, T, H]
    stages.append(tensor_stage("draft.fc", "fc(aux)", hidden))
    tokens = torch.cat([ids[:, 1:], next_token.view(1, 1)], dim=1).to(
        param.device
    )  # [1, T]: x[t+1] pairs with h_t
    stages.append(tensor_stage("draft.step0", "input_ids (shifted)", tokens))
    positions = torch.arange(T, device=param.device)[None]
    kv = GrowingKV()
    out = draft(tokens, hidden, positions, kv=kv)
    chain: list[int] = []
    for step in range(num_steps):
        draft_id = out.logits[0, -1].argmax()
        target_id = int(draft.to_target_ids(draft_id))
        chain.append(target_id)
        token_text = target.tokenizer.decode([target_id]) if target.tokenizer is not None else ""
        stages.append(tensor_stage(f"draft.step{step}", "hidden (pre-norm, fed back)", out.hidden))
        stages.append(
            tensor_stage(
                f"draft.step{step}",
                "logits",
                out.logits,
                draft_token=int(draft_id),
                target_token=target_id,
                text=token_text,
            )
        )
        if step + 1 == num_steps:
            break
        pos = positions[:, -1:] + step + 1
        out = draft(torch.tensor([[target_id]], device=param.device), out.hidden[:, -1:], pos, kv=kv)
    stages.append(
        {
            "stage": "summary",
            "tensor": "draft chain",
            "target_next_token": int(next_token),
            "draft_tokens": chain,
        }
    )
    return stages


def trace_text(stages: list[dict[str, Any]]) -> list[str]:
    """One line per stage, like the hand-added EAGLE3_DEBUG prints."""
    lines = []
    for s in stages:
        extra = {
            k: v
            for k, v in s.items()
            if k
            not in (
                "stage",
                "tensor",
                "shape",
                "dtype",
                "norm_mean",
                "norm_last",
                "leading_last",
                "values_last",
            )
        }
        head = f"[{s['stage']}] {s['tensor']}"
        if "shape" in s:
            head += f" shape={s['shape']} dtype={s['dtype']}"
        if "norm_mean" in s:
            head += f" norm(mean)={s['norm_mean']:.4g} norm(last)={s['norm_last']:.4g} last[:{LEADING_VALUES}]={s['leading_last']}"
        if "values_last" in s:
            head += f" last={s['values_last']}"
        if extra:
            head += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        lines.append(head)
    return lines
