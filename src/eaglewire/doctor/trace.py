"""`doctor --trace`: every tensor crossing the target -> draft boundary for one prompt, stage by stage.

What the field reports added by hand as EAGLE3_DEBUG prints (shapes, norms, leading values at
each stage), built in. The prompt runs through our engine (`eaglewire.engine.speculative.
speculative_generate`, greedy) with two observers and no change to the engine:

- a TargetRunner proxy records each target forward (prefill, then every verification): the
  tokens and positions it was given, each aux column (with its boundary) and their
  concatenation, the target's argmax, and which rows were committed;
- a Drafter subclass records what `extend` receives (the aux rows the engine selected after
  verification, the tokens paired with them, their positions), the fc output and the draft
  layer's output on every call, and the tree each round drafts.

Each stage is one JSON-able dict; `trace_text` renders them as lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eaglewire.contract.contract import Contract
from eaglewire.contract.numbering import describe_boundary
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.factory import RunnerKind, make_runner
from eaglewire.engine.runners.protocol import TargetForward, TargetRunner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.tree import DraftTree
from eaglewire.engine.verify import StopRule
from eaglewire.errors import ConfigError
from eaglewire.target.loading import LoadedTarget

LEADING_VALUES = 5
DEFAULT_TRACE_SPEC = SpecArgs.chain(3)
DEFAULT_TRACE_TOKENS = 6
NUMERIC_KEYS = ("stage", "tensor", "shape", "dtype", "norm_mean", "norm_last", "leading_last", "values_last")


def tensor_stage(stage: str, name: str, x: torch.Tensor, **extra: Any) -> dict[str, Any]:
    """Shape, dtype, per-token L2 norms (mean and last row) and the last row's leading values."""
    entry: dict[str, Any] = {
        "stage": stage,
        "tensor": name,
        "shape": list(x.shape),
        "dtype": str(x.dtype).removeprefix("torch."),
    }
    if x.is_floating_point() and x.dim() >= 2:
        xf = x.detach().float()
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


class TracingRunner:
    """A TargetRunner that records every forward and commit of the runner it wraps."""

    def __init__(self, inner: TargetRunner, contract: Contract, stages: list[dict[str, Any]]) -> None:
        self.inner = inner
        self.contract = contract
        self.stages = stages
        self.num_layers = inner.num_layers
        self.vocab_size = inner.vocab_size
        self.device = inner.device
        self.dtype = inner.dtype
        self.calls = 0

    def reset(self, batch_size: int) -> None:
        self.inner.reset(batch_size)

    @property
    def lengths(self) -> torch.Tensor:
        return self.inner.lengths

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None = None
    ) -> TargetForward:
        fwd = self.inner.forward(input_ids, positions, tree_mask)
        stage = "target.prefill" if self.calls == 0 else f"target.verify{self.calls}"
        self.calls += 1
        L, bounds = self.num_layers, self.contract.aux_boundaries
        ht = fwd.aux.shape[-1] // len(bounds)
        self.stages.append(tensor_stage(stage, "input_ids", input_ids))
        self.stages.append(tensor_stage(stage, "positions", positions))
        for i, b in enumerate(bounds):
            col = fwd.aux[..., i * ht : (i + 1) * ht]  # [B, N, Ht]
            self.stages.append(
                tensor_stage(stage, f"aux[{i}]", col, boundary=b, meaning=describe_boundary(b, L))
            )
        self.stages.append(tensor_stage(stage, "aux (concatenated)", fwd.aux, boundaries=list(bounds)))
        self.stages.append(
            tensor_stage(stage, "logits", fwd.logits, argmax_last=int(fwd.logits[0, -1].argmax()))
        )
        return fwd

    def commit(self, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        n = int(num_accepted[0])
        self.stages.append(
            {
                "stage": f"target.commit{self.calls - 1}",
                "tensor": "accepted rows",
                "rows": [int(v) for v in accepted[0, :n]],
            }
        )
        self.inner.commit(accepted, num_accepted)


class TracingDrafter(Drafter):
    """A Drafter that records its inputs, the fc output and the draft layer's output on every call."""

    def __init__(self, draft: Eagle3Draft, spec: SpecArgs, stages: list[dict[str, Any]]) -> None:
        super().__init__(draft, spec, cuda_graphs=False)  # hooks do not fire inside replayed graphs
        self.stages = stages
        self.phase = "draft"
        self.rounds = 0
        self._handles = [
            draft.fc.register_forward_hook(self._hook("fc(aux)")),
            draft.layer.register_forward_hook(self._hook("draft layer output (pre-norm hidden, fed back)")),
        ]

    def _hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], torch.Tensor], None]:
        def fn(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
            self.stages.append(tensor_stage(self.phase, name, output))

        return fn

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def extend(self, aux: torch.Tensor, tokens: torch.Tensor, start_position: int) -> None:
        self.phase = f"draft.extend{self.rounds}"
        self.stages.append(
            tensor_stage(self.phase, "aux rows given to the draft", aux, start_position=start_position)
        )
        self.stages.append(tensor_stage(self.phase, "tokens paired with them", tokens))
        super().extend(aux, tokens, start_position)

    def draft_tree(
        self,
        root_token: int,
        root_position: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> DraftTree:
        self.phase = f"draft.tree{self.rounds}"
        tree = super().draft_tree(root_token, root_position, sampling, generator)
        self.stages.append(
            tensor_stage(self.phase, "tree tokens (root first)", tree.tokens, root_position=root_position)
        )
        self.rounds += 1
        return tree


def encode_prompt(target: LoadedTarget, prompt: str) -> list[int]:
    """The prompt as the engine feeds it: through the chat template when the tokenizer has one."""
    if target.tokenizer is None:
        raise ConfigError(f"target {target.path}: no tokenizer, so --prompt text cannot be encoded")
    tok = target.tokenizer
    if getattr(tok, "chat_template", None):
        enc = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    else:
        ids = tok(prompt, add_special_tokens=True)["input_ids"]
    return [int(i) for i in ids]


@torch.no_grad()
def run_trace(
    target: LoadedTarget,
    draft: Eagle3Draft,
    contract: Contract,
    prompt: str,
    *,
    spec: SpecArgs = DEFAULT_TRACE_SPEC,
    max_new_tokens: int = DEFAULT_TRACE_TOKENS,
    runner: RunnerKind = "auto",
) -> list[dict[str, Any]]:
    """Greedy speculative decoding of `prompt` for `max_new_tokens` on the engine's `runner`
    ('auto': the fast runtime where it applies, as `eaglewire generate` uses), every boundary tensor recorded."""
    stages: list[dict[str, Any]] = []
    ids = encode_prompt(target, prompt)
    tracer = TracingRunner(make_runner(target, contract.aux_boundaries, kind=runner), contract, stages)
    drafter = TracingDrafter(draft, spec, stages)
    try:
        result = speculative_generate(
            tracer,
            drafter,
            ids,
            sampling=SamplingParams(),
            stop=StopRule(max_new_tokens=max_new_tokens, eos_token_ids=frozenset(target.eos_token_ids)),
        )
    finally:
        drafter.close()
    stages.append(
        {
            "stage": "summary",
            "tensor": "generation",
            "prompt_tokens": len(ids),
            "generated": result.token_ids,
            "accepted_per_round": result.accepted_per_round,
            "spec": [spec.num_steps, spec.topk, spec.num_draft_tokens],
        }
    )
    return stages


def trace_text(stages: list[dict[str, Any]]) -> list[str]:
    """One line per stage, like the hand-added EAGLE3_DEBUG prints."""
    lines = []
    for s in stages:
        head = f"[{s['stage']}] {s['tensor']}"
        if "shape" in s:
            head += f" shape={s['shape']} dtype={s['dtype']}"
        if "norm_mean" in s:
            head += f" norm(mean)={s['norm_mean']:.4g} norm(last)={s['norm_last']:.4g} last[:{LEADING_VALUES}]={s['leading_last']}"
        if "values_last" in s:
            head += f" last={s['values_last']}"
        extra = {k: v for k, v in s.items() if k not in NUMERIC_KEYS}
        if extra:
            head += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        lines.append(head)
    return lines
