"""The benchmark's only contact with eaglewire's engine: load it, and decode one prompt.

Everything the harness and the sweep need from `eaglewire.engine` passes through the functions
here, so an engine API change is a change in this file only:

* `load_engine`: the target runner(s) and the draft (its contract checked against the target);
* `speculative_fn`: a decoder for one SpecArgs (or none: plain decoding on the speculative
  runner) as `prompt_ids -> Outcome`;
* `plain_fn`: `eaglewire.engine.plain` (batched plain decoding) as `prompts -> Outcome`s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewire.contract.contract import Contract
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.target.loading import LoadedTarget


@dataclass
class Outcome:
    """What one decode of one prompt produced (batch 1), in engine-neutral terms."""

    token_ids: list[int]  # generated tokens only (eos included when it ended the generation)
    finish_reason: str = ""
    tau: float | None = None  # tokens per target verification, bonus included (speculative only)
    per_position_acceptance: list[float] = field(default_factory=list)  # [k] P(>= k+1 drafts accepted)
    num_verifications: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)  # prefill / draft / verify / accept
    accepted_per_round: list[int] = field(default_factory=list)  # drafts each verification accepted
    emitted_per_round: list[int] = field(default_factory=list)  # tokens each produced, past the stop too
    accepted_paths: list[list[int]] = field(default_factory=list)  # tree nodes each round accepted


@dataclass
class Engine:
    target: LoadedTarget
    runner: Any  # TargetRunner capturing the draft's aux boundaries (batch 1)
    draft: Eagle3Draft | None
    eos_token_ids: tuple[int, ...]
    max_seq_len: int
    contract: Contract | None = None  # the draft's contract (its wiring; None without a draft)
    # Built on first use and kept, so benchmarking several prompt sets (or rerunning a setting) on
    # one engine compiles and captures each decoder's graphs once.
    decoders: dict[SpecArgs | None, Any] = field(default_factory=dict)
    plain_runners: dict[int, Any] = field(default_factory=dict)


def load_engine(target: LoadedTarget, draft_dir: Path | None, *, max_seq_len: int) -> Engine:
    """The batch-1 speculative runner for `target` and the draft in `draft_dir` (None: no draft)."""
    from eaglewire.draft.io import load_draft
    from eaglewire.engine.api import check_draft_fits_target
    from eaglewire.engine.runners.factory import make_runner

    draft = None
    contract = None
    if draft_dir is not None:  # the draft's boundaries (a shallow target may have no default ones)
        draft, contract = load_draft(Path(draft_dir), device=target.device, dtype=target.dtype)
        check_draft_fits_target(contract, target)
    # no draft: plain decoding reads no aux states, so a target of any depth will do
    boundaries: Sequence[int] = contract.aux_boundaries if contract is not None else ()
    runner = make_runner(target, boundaries, "auto", max_seq_len=max_seq_len)
    return Engine(target, runner, draft, target.eos_token_ids, max_seq_len, contract)


def speculative_fn(engine: Engine, spec: SpecArgs | None) -> Callable[[list[int], int], Outcome]:
    """Decode with EAGLE-3 (`spec`) or, with spec None, plainly on the same runner; greedy."""
    from eaglewire.engine.api import DEFAULT_SPEC, SpeculativeDecoder

    use_draft = spec is not None
    decoder = engine.decoders.get(spec)
    if decoder is None:
        decoder = engine.decoders[spec] = SpeculativeDecoder(
            engine.runner,
            engine.draft if use_draft else None,
            spec or DEFAULT_SPEC,
            tokenizer=engine.target.tokenizer,
            eos_token_ids=engine.eos_token_ids,
        )

    def run(prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        r = decoder.generate(prompt_ids, max_new_tokens=max_new_tokens, use_draft=use_draft)
        return Outcome(
            token_ids=list(r.token_ids),
            finish_reason=r.finish_reason,
            tau=r.tau if use_draft else None,
            per_position_acceptance=list(r.per_position_acceptance),
            num_verifications=r.num_verifications,
            phase_seconds=dict(r.phase_times),
            accepted_per_round=list(r.accepted_per_round) if use_draft else [],
            emitted_per_round=list(r.emitted_per_round) if use_draft else [],
            accepted_paths=[list(p) for p in r.accepted_paths] if use_draft else [],
        )

    return run


def make_plain_runner(engine: Engine, batch_size: int) -> Any:
    """A runner for `eaglewire.engine.plain` (no aux capture) holding `batch_size` sequences (kept
    in `engine.plain_runners`)."""
    from eaglewire.engine.runners.factory import make_runner

    runner = engine.plain_runners.get(batch_size)
    if runner is None:
        runner = engine.plain_runners[batch_size] = make_runner(
            engine.target, (), max_batch_size=batch_size, max_seq_len=engine.max_seq_len
        )
    return runner


def plain_fn(engine: Engine, runner: Any) -> Callable[[list[list[int]], int], list[Outcome]]:
    """Greedy batched plain decoding (`generate_plain_with_stats`) over `runner`."""
    from eaglewire.engine.plain import generate_plain_with_stats

    def run(prompts: list[list[int]], max_new_tokens: int) -> list[Outcome]:
        r = generate_plain_with_stats(runner, prompts, max_new_tokens, eos_token_ids=engine.eos_token_ids)
        phases = {"prefill": r.prefill_seconds, "decode": r.decode_seconds}
        return [Outcome(token_ids=list(t), phase_seconds=phases) for t in r.tokens]

    return run
