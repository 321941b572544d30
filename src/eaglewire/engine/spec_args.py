"""The three speculative-decoding knobs, with exactly SGLang's meaning, and SGLang's rewrite rules.

    num_steps         = SGLang --speculative-num-steps: draft forward passes per round, i.e. the
                        depth D of the deepest draft token.
    topk              = SGLang --speculative-eagle-topk: children kept per expanded node, and the
                        beam width of the EAGLE-2 expansion (1 = a chain).
    num_draft_tokens  = SGLang --speculative-num-draft-tokens: tree nodes the target verifies per
                        round, the root (last accepted token) included, so `num_draft_tokens - 1`
                        are drafted tokens.

SGLang rewrites some combinations with only a log line (a field report lost days to
`--speculative-num-steps 1 --speculative-num-draft-tokens 16`, silently run with 2 draft tokens).
Here every such combination is an error naming both fields and the value SGLang would have used.
`sglang_effective_spec_args` holds the rules in one place so `doctor` can lint server arguments.

Source of the rules (read, not copied): sgl-project/sglang
`python/sglang/srt/arg_groups/speculative_hook.py` at commit 004c82e07d876f6e4a0ad6e15325706b0f478f1a
(`handle_speculative_decoding` -> `_handle_eagle_family`, `_auto_choose_speculative_params`; the
same topk == 1 rule sat in `ServerArgs.__post_init__` of `python/sglang/srt/server_args.py` in
earlier releases), and `python/sglang/srt/speculative/eagle_utils.py` `organize_draft_results`
(`torch.topk(scores, num_draft_tokens - 1)` over `topk + (num_steps - 1) * topk**2` candidates).
Re-check these when the SGLang version changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eaglewire.errors import ConfigError
from eaglewire.typed_config import help_field

log = logging.getLogger(__name__)

SGLANG_RULES_SOURCE = (
    "sgl-project/sglang python/sglang/srt/arg_groups/speculative_hook.py @ 004c82e0 (_handle_eagle_family)"
)
# SGLang's auto-chosen (num_steps, topk, num_draft_tokens) when none of the three is passed.
SGLANG_AUTO_LLAMA_LIKE = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
SGLANG_AUTO_LLAMA = (5, 4, 8)
SGLANG_AUTO_OTHER = (3, 1, 4)

FLAG = {
    "num_steps": "--speculative-num-steps",
    "topk": "--speculative-eagle-topk",
    "num_draft_tokens": "--speculative-num-draft-tokens",
}


@dataclass(frozen=True)
class SpecRewrite:
    """One value SGLang would change (or choose) without failing."""

    field: str  # "num_steps" | "topk" | "num_draft_tokens"
    requested: int | None  # None = not passed
    effective: int
    reason: str

    def explain(self) -> str:
        req = "not passed" if self.requested is None else f"{self.requested}"
        return f"{FLAG[self.field]}: requested {req}, SGLang uses {self.effective} ({self.reason})"


def max_candidates(num_steps: int, topk: int) -> int:
    """Draft tokens an EAGLE-2 expansion scores: topk at depth 1, topk*topk per further step."""
    return topk + (num_steps - 1) * topk * topk


def sglang_effective_spec_args(
    num_steps: int | None,
    topk: int | None,
    num_draft_tokens: int | None,
    *,
    architecture: str | None = None,
) -> tuple[SpecArgs, list[SpecRewrite]]:
    """What SGLang (EAGLE/EAGLE3) would run for these flags, and each value it rewrites or chooses.

    None = the flag was not passed. Raises ConfigError for combinations SGLang itself rejects
    (an assertion at startup, or a crash at the first draft step). `architecture` (the target's
    HF class) picks SGLang's auto-chosen defaults when no flag is passed.
    """
    steps, k, nodes, rewrites = _sglang_rules(num_steps, topk, num_draft_tokens, architecture)
    return SpecArgs(steps, k, nodes), rewrites


def _sglang_rules(
    num_steps: int | None, topk: int | None, num_draft_tokens: int | None, architecture: str | None
) -> tuple[int, int, int, list[SpecRewrite]]:
    rewrites: list[SpecRewrite] = []
    if num_steps is None:
        if topk is not None or num_draft_tokens is not None:
            raise ConfigError(
                f"{FLAG['num_steps']} not passed but {FLAG['topk']}={topk} / {FLAG['num_draft_tokens']}="
                f"{num_draft_tokens} are: SGLang asserts all three are unset before auto-choosing them",
                fix=f"pass {FLAG['num_steps']} too",
            )
        auto = SGLANG_AUTO_LLAMA if architecture in SGLANG_AUTO_LLAMA_LIKE else SGLANG_AUTO_OTHER
        why = f"auto-chosen for architecture {architecture or '<unknown>'}"
        for name, value in zip(("num_steps", "topk", "num_draft_tokens"), auto, strict=True):
            rewrites.append(SpecRewrite(name, None, value, why))
        num_steps, topk, num_draft_tokens = auto
    if topk is None or num_draft_tokens is None:
        raise ConfigError(
            f"{FLAG['num_steps']}={num_steps} passed without {FLAG['topk']} / {FLAG['num_draft_tokens']}: "
            "SGLang has no default for them then",
            fix="pass all three, or none",
        )
    for name, value in (("num_steps", num_steps), ("topk", topk), ("num_draft_tokens", num_draft_tokens)):
        if value < 1:
            raise ConfigError(f"{FLAG[name]}: expected a positive integer, got {value}")
    if topk == 1 and num_draft_tokens != num_steps + 1:
        rewrites.append(
            SpecRewrite(
                "num_draft_tokens",
                num_draft_tokens,
                num_steps + 1,
                f"with {FLAG['topk']}=1 SGLang forces {FLAG['num_draft_tokens']} = {FLAG['num_steps']} + 1 "
                f"= {num_steps} + 1",
            )
        )
        num_draft_tokens = num_steps + 1
    limit = max_candidates(num_steps, topk)
    if num_draft_tokens - 1 > limit:
        raise ConfigError(
            f"{FLAG['num_draft_tokens']}={num_draft_tokens} needs {num_draft_tokens - 1} drafted tokens but "
            f"{FLAG['num_steps']}={num_steps} with {FLAG['topk']}={topk} scores only "
            f"topk + (num_steps-1)*topk^2 = {limit}; SGLang fails at its first draft step (torch.topk)",
            fix=f"use {FLAG['num_draft_tokens']} <= {limit + 1}, or raise {FLAG['num_steps']} / {FLAG['topk']}",
        )
    return num_steps, topk, num_draft_tokens, rewrites


def spec_args_warnings(args: SpecArgs) -> list[str]:
    """Combinations SGLang accepts unchanged but that waste work."""
    out = []
    if args.topk > 1 and args.num_draft_tokens - 1 < args.num_steps:
        out.append(
            f"num_steps={args.num_steps} but num_draft_tokens={args.num_draft_tokens} keeps only "
            f"{args.num_draft_tokens - 1} drafted tokens: depths beyond {args.num_draft_tokens - 1} are drafted "
            "and never verified"
        )
    return out


@dataclass(frozen=True)
class SpecArgs:
    """Speculative decoding shape (SGLang semantics, see the module docstring). Batch 1."""

    num_steps: int = help_field(
        "draft forward passes per round = depth of the deepest draft token (SGLang --speculative-num-steps)"
    )
    topk: int = help_field(
        "children per expanded node and beam width; 1 = a chain (SGLang --speculative-eagle-topk)"
    )
    num_draft_tokens: int = help_field(
        "tree nodes verified per round, root included (SGLang --speculative-num-draft-tokens)"
    )

    def __post_init__(self) -> None:
        for name in ("num_steps", "topk", "num_draft_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
        *_, rewrites = _sglang_rules(self.num_steps, self.topk, self.num_draft_tokens, None)
        if rewrites:  # the only rule that can fire here: topk == 1 forces num_draft_tokens
            r = rewrites[0]
            fix = f"for a chain of {self.num_steps} draft tokens pass num_draft_tokens={r.effective}"
            if self.num_draft_tokens >= 2:
                fix += f"; for {self.num_draft_tokens - 1} draft tokens pass num_steps={self.num_draft_tokens - 1}"
            raise ConfigError(
                f"{r.field}={r.requested} with num_steps={self.num_steps}, topk={self.topk}: SGLang would silently "
                f"run {r.field}={r.effective} ({r.reason}); eaglewire refuses instead of rewriting",
                fix=fix + "; or use topk > 1 for a tree",
            )
        if self.num_draft_tokens < 2:
            raise ConfigError(
                f"num_draft_tokens={self.num_draft_tokens}: the root alone drafts nothing",
                fix="use num_draft_tokens >= 2, or plain decoding (no draft)",
            )
        for w in spec_args_warnings(self):
            log.warning("%s", w)

    @classmethod
    def chain(cls, num_steps: int) -> SpecArgs:
        """A chain of `num_steps` draft tokens (topk=1, num_draft_tokens = num_steps + 1)."""
        return cls(num_steps=num_steps, topk=1, num_draft_tokens=num_steps + 1)

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    def sglang_flags(self) -> list[str]:
        """The SGLang launch flags that run exactly this shape."""
        return [
            FLAG["num_steps"], str(self.num_steps),
            FLAG["topk"], str(self.topk),
            FLAG["num_draft_tokens"], str(self.num_draft_tokens),
        ]  # fmt: skip


DEFAULT_SPEC = SpecArgs(*SGLANG_AUTO_LLAMA)  # SGLang's auto choice for Llama targets
