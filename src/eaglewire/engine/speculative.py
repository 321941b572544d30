"""The speculative decoding loop (batch 1): draft a tree, verify it in one target forward, commit.

Bookkeeping invariant: the target cache holds every token except the newest one, the *root*.
Prefill therefore runs the prompt without its last token, and every round verifies a tree whose
root is the newest token, so even the first generated token comes out of a verification.
Without a draft the tree is the root alone and the loop is plain decoding on the same runner.

    prefill:  target(prompt[:-1]) -> commit; draft.extend(aux, prompt[1:])
    round:    tree   = draft(root)                              num_steps draft forwards
              fwd    = target(tree tokens, positions, mask)     one target forward
              verdict= verify(tree, fwd.logits)                 accepted path + bonus
              target.commit(path); emit verdict tokens; stop?   eos / stop string / max tokens
              draft.extend(fwd.aux[path], emitted)              rows for the accepted tokens
              root   = bonus
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from eaglewire.engine.drafting import Drafter
from eaglewire.engine.interfaces import TargetRunner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.tree import root_only
from eaglewire.engine.verify import StopRule, Verdict, verify


class PhaseClock:
    """Wall time per phase; synchronises the device at phase edges so GPU time lands in its phase."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass
class DecodeTrace:
    token_ids: list[int]  # generated tokens (eos included when it ended the generation)
    finish_reason: str  # "eos" | "stop_string" | "max_new_tokens"
    accepted_per_round: list[int] = field(default_factory=list)  # drafts accepted by each verification
    emitted_per_round: list[int] = field(default_factory=list)  # tokens each verification produced (bonus incl.)
    phase_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def num_verifications(self) -> int:
        return len(self.accepted_per_round)


def _ids(tokens: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([tokens], dtype=torch.long, device=device)  # [1, T]


def speculative_generate(
    runner: TargetRunner,
    drafter: Drafter | None,
    prompt_ids: list[int],
    *,
    sampling: SamplingParams,
    stop: StopRule,
    verify_generator: torch.Generator | None = None,
    draft_generator: torch.Generator | None = None,
) -> DecodeTrace:
    """Generate after `prompt_ids` (>= 1 token). `drafter=None` decodes plainly on the same runner."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: at least one token is needed")
    device = runner.device
    clock = PhaseClock(device)
    runner.reset(1)
    if drafter is not None:
        drafter.reset()

    # Prefill: all but the newest prompt token enter the target cache; the newest is the first root.
    *context, root = prompt_ids
    if context:
        with clock("prefill"):
            n = len(context)
            fwd = runner.forward(_ids(context, device), torch.arange(n, device=device)[None])
            runner.commit(torch.arange(n, device=device)[None], torch.tensor([n], device=device))
            if drafter is not None:
                drafter.extend(fwd.aux[0], torch.tensor(prompt_ids[1:]), start_position=0)

    generated: list[int] = []
    trace = DecodeTrace(token_ids=generated, finish_reason="max_new_tokens")
    while True:
        root_position = len(prompt_ids) + len(generated) - 1
        with clock("draft"):
            if drafter is None:
                tree = root_only(root, device)
            else:
                tree = drafter.draft_tree(root, root_position, sampling, draft_generator)
        with clock("verify"):
            fwd = runner.forward(
                tree.tokens[None].to(device),
                tree.positions(root_position)[None].to(device),
                tree.ancestor_mask()[None].to(device),
            )
            verdict: Verdict = verify(tree, fwd.logits[0], sampling, verify_generator)
        with clock("accept"):
            path = torch.tensor(verdict.path, device=device)
            runner.commit(path[None], torch.tensor([len(verdict.path)], device=device))
            trace.accepted_per_round.append(verdict.num_accepted_drafts)
            trace.emitted_per_round.append(len(verdict.emitted))
            kept, finish = stop.cut(generated, verdict.emitted)
            generated.extend(kept)
        if finish is not None:
            trace.finish_reason = finish
            break
        if drafter is not None:
            with clock("draft"):
                drafter.extend(fwd.aux[0, path], torch.tensor(verdict.emitted), start_position=root_position)
        root = verdict.emitted[-1]
    trace.phase_seconds = dict(clock.seconds)
    return trace
