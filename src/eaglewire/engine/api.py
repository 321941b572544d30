"""Python API: `SpeculativeDecoder(...).generate(prompt)` and `generate(target, draft, prompt)`.

`generate` decodes one sequence at a time (the single-request path); `generate_batch` and
`batch_engine` decode many together (`engine.batch`: continuous batching, each row its own
acceptance). Greedy speculative output equals plain greedy output token for token; sampled
output follows the target's processed (temperature, top-p) distribution exactly.

    decoder = SpeculativeDecoder.load("smollm2", "runs/draft", spec=SpecArgs(5, 4, 8))
    result = decoder.generate("Write a haiku about rain.", max_new_tokens=64)
    result.text, result.tau, result.per_position_acceptance
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from eaglewire.contract.contract import CONTRACT_FILE, Contract
from eaglewire.draft.io import load_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.batch.drafter import BatchDrafter
from eaglewire.engine.batch.engine import BatchEngine, BatchRequest, Policy
from eaglewire.engine.decode_trace import DecodeTrace, RoundCallback
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.fits import ContextFit
from eaglewire.engine.runners.factory import RunnerKind, make_runner
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.runners.protocol import TargetRunner
from eaglewire.engine.sampling import SamplingParams, make_generator
from eaglewire.engine.spec_args import DEFAULT_SPEC, SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.timers import PhaseTimers
from eaglewire.engine.verify import StopRule
from eaglewire.errors import ConfigError, ContractMismatchError
from eaglewire.target.identity import target_identity
from eaglewire.target.loading import LoadedTarget, load_target


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated tokens only
    finish_reason: str  # "eos" | "stop_string" | "max_new_tokens" | "cancelled" (on_round returned False)
    tau: float  # tokens per target verification forward, bonus included (1.0 without a draft)
    per_position_acceptance: list[float]  # [k] fraction of verifications that accepted >= k+1 drafts
    tokens_per_s: float  # generated tokens / decode seconds (prefill excluded)
    phase_times: dict[str, float]  # seconds per phase: prefill, draft, verify, accept
    num_verifications: int
    prompt_tokens: int
    accepted_per_round: list[int] = field(default_factory=list)  # drafts each verification accepted
    emitted_per_round: list[int] = field(default_factory=list)  # tokens each produced (bonus incl.; the
    # last round's may run past max_new_tokens / eos: token_ids is cut there, these are not)
    accepted_paths: list[list[int]] = field(default_factory=list)  # tree nodes each round accepted (root
    # first): what a scale-model benchmark replays (benchmarks/scale_model.py)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_draft_fits_target(contract: Contract, target: LoadedTarget) -> None:
    """The draft was trained on this target (identity hashes) with boundaries it has."""
    live = target_identity(target)
    theirs = contract.target
    diffs = [
        f"target.{k}: draft contract={getattr(theirs, k)} live target={getattr(live, k)}"
        for k in ("architecture", "num_layers", "hidden_size", "vocab_size", "config_hash", "tokenizer_hash")
        if getattr(theirs, k) != getattr(live, k)
    ]
    if diffs:
        raise ContractMismatchError(
            "the draft's contract.json names a different target:\n  " + "\n  ".join(diffs),
            fix="decode with the target the draft was trained for, or retrain the draft",
        )


def _per_position(trace: DecodeTrace, num_steps: int) -> list[float]:
    rounds = max(trace.num_verifications, 1)
    return [sum(a >= k for a in trace.accepted_per_round) / rounds for k in range(1, num_steps + 1)]


class SpeculativeDecoder:
    """Batch-1 speculative decoder over a TargetRunner; `draft=None` decodes plainly on the same runner."""

    def __init__(
        self,
        runner: TargetRunner,
        draft: Eagle3Draft | None,
        spec: SpecArgs = DEFAULT_SPEC,
        *,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        if draft is not None and draft.config.vocab_size != runner.vocab_size:
            raise ContractMismatchError(
                f"draft vocab_size={draft.config.vocab_size} but the target's is {runner.vocab_size}"
            )
        self.runner = runner
        self.draft = draft
        self.spec = spec
        max_seq_len = getattr(runner, "max_seq_len", None)
        self.drafter = None if draft is None else Drafter(draft, spec, max_seq_len=max_seq_len)
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        # what a request may use (`engine.fits`), drafting and plain: built once, checked per call
        positions = getattr(runner, "max_positions", None)
        self._fits = {
            use_draft: ContextFit.of(
                positions=positions,
                capacity=max_seq_len,
                tree_tokens=spec.num_draft_tokens if use_draft and draft is not None else 0,
            )
            for use_draft in (True, False)
        }
        # one set of phase timers for every generate call: its CUDA events are reused across calls
        # (each call resets it), so a warm decoder allocates none in its round loop
        self.timers = PhaseTimers(enabled=True, device=runner.device)
        self._batch_drafters: dict[int, BatchDrafter] = {}  # by max_rows: graphs stay captured

    @classmethod
    def load(
        cls,
        target: str | Path | LoadedTarget,
        draft: str | Path | None,
        *,
        spec: SpecArgs = DEFAULT_SPEC,
        dtype: str = "float32",
        device: str = "cpu",
        runner: RunnerKind = "auto",
        max_seq_len: int | None = None,
        max_batch_size: int = 1,
    ) -> SpeculativeDecoder:
        """Load a target and (optionally) a draft directory; check the draft's contract names this target.
        Without a draft the runner captures no aux states (plain decoding needs none)."""
        if draft is not None and (Path(draft) / CONTRACT_FILE).is_file():
            # a contract that contradicts itself is refused before the target loads
            Contract.load(Path(draft))
        loaded = (
            target if isinstance(target, LoadedTarget) else load_target(target, dtype=dtype, device=device)
        )
        draft_model = None
        boundaries: Sequence[int] = ()  # plain decoding reads no aux states: any depth of target will do
        if draft is not None:
            draft_model, contract = load_draft(Path(draft), device=loaded.device, dtype=loaded.dtype)
            check_draft_fits_target(contract, loaded)
            boundaries = contract.aux_boundaries
        return cls(
            make_runner(loaded, boundaries, runner, max_seq_len=max_seq_len, max_batch_size=max_batch_size),
            draft_model,
            spec,
            tokenizer=loaded.tokenizer,
            eos_token_ids=loaded.eos_token_ids,
        )

    def encode(self, prompt: str, *, chat: bool = True) -> list[int]:
        """Prompt text -> token ids, with the chat template (a user turn + generation prompt) by default."""
        return encode_text(self.tokenizer, prompt, chat=chat)

    def context_fit(self, *, use_draft: bool = True) -> ContextFit:
        """What one request may use on this decoder's runner (`engine.fits`): `generate` refuses more."""
        return self._fits[use_draft]

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int = 128,
        sampling: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        chat: bool = True,
        use_draft: bool = True,
        on_round: RoundCallback | None = None,
    ) -> GenerationResult:
        """Generate after `prompt` (text, chat-templated unless chat=False; or token ids as given).
        on_round: called after every verified round with the tokens it added (streaming); returning
        False stops after that round with finish_reason "cancelled" (`engine.speculative`)."""
        prompt_ids = self.encode(prompt, chat=chat) if isinstance(prompt, str) else [int(t) for t in prompt]
        self._fits[use_draft].check(len(prompt_ids), max_new_tokens)
        decode = None if self.tokenizer is None else self._decode
        rule = StopRule(max_new_tokens, self.eos_token_ids, tuple(stop), decode)
        drafter = self.drafter if use_draft else None
        draft_device = self.drafter.device if self.drafter is not None else torch.device("cpu")
        trace = speculative_generate(
            self.runner,
            drafter,
            prompt_ids,
            sampling=sampling,
            stop=rule,
            verify_generator=make_generator(sampling, "cpu"),
            draft_generator=make_generator(SamplingParams(seed=sampling.seed + 1), draft_device),
            timers=self.timers,
            on_round=on_round,
        )
        decode_seconds = sum(v for k, v in trace.phase_seconds.items() if k != "prefill")
        return self._result(
            trace, prompt_ids, rule, use_draft=drafter is not None, decode_seconds=decode_seconds
        )

    def _result(
        self,
        trace: DecodeTrace,
        prompt_ids: list[int],
        rule: StopRule,
        *,
        use_draft: bool,
        decode_seconds: float,
    ) -> GenerationResult:
        decode = self.tokenizer is not None
        text = rule.final_text(self._decode(trace.token_ids), trace.finish_reason) if decode else ""
        return GenerationResult(
            text=text,
            token_ids=list(trace.token_ids),
            finish_reason=trace.finish_reason,
            tau=sum(trace.emitted_per_round) / max(trace.num_verifications, 1),
            per_position_acceptance=_per_position(trace, self.spec.num_steps) if use_draft else [],
            tokens_per_s=len(trace.token_ids) / decode_seconds if decode_seconds > 0 else float("inf"),
            phase_times=trace.phase_seconds,
            num_verifications=trace.num_verifications,
            prompt_tokens=len(prompt_ids),
            accepted_per_round=list(trace.accepted_per_round),
            emitted_per_round=list(trace.emitted_per_round),
            accepted_paths=[list(p) for p in trace.accepted_paths],
        )

    def batch_engine(
        self, max_rows: int, *, policy: Policy | None = None, use_draft: bool = True
    ) -> BatchEngine:
        """A continuous-batching engine over this decoder's runner for up to `max_rows` requests at
        once (`engine.batch.engine`). The runner is shared with `generate`: use one or the other at
        a time. policy: the setting per number of running rows (None: the decoder's spec always)."""
        if not isinstance(self.runner, FastTargetRunner):
            raise ConfigError(
                f"batched speculative decoding needs the fast runtime; this target runs on {type(self.runner).__name__}",
                fix="a Llama-family target (--runner fast), or --max-batch 1",
            )
        drafter = None
        if self.draft is not None and use_draft:
            drafter = self._batch_drafters.get(max_rows)
            if drafter is None:
                drafter = BatchDrafter(
                    self.draft, self.spec, max_rows=max_rows, max_seq_len=self.runner.max_seq_len
                )
                self._batch_drafters[max_rows] = drafter
        return BatchEngine(self.runner, drafter, max_rows=max_rows, policy=policy)

    def batch_request(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int = 128,
        sampling: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        chat: bool = True,
        on_round: RoundCallback | None = None,
    ) -> BatchRequest:
        """The `BatchRequest` that `generate` with these arguments would decode."""
        prompt_ids = self.encode(prompt, chat=chat) if isinstance(prompt, str) else [int(t) for t in prompt]
        decode = None if self.tokenizer is None else self._decode
        rule = StopRule(max_new_tokens, self.eos_token_ids, tuple(stop), decode)
        return BatchRequest(prompt_ids, rule, sampling, on_round)

    def result_of(self, request: BatchRequest, trace: DecodeTrace, decode_seconds: float) -> GenerationResult:
        """A finished batched request as `generate` reports it (decode_seconds: its share of time)."""
        return self._result(
            trace,
            request.prompt_ids,
            request.stop,
            use_draft=self.draft is not None,
            decode_seconds=decode_seconds,
        )

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        max_batch: int,
        max_new_tokens: int = 128,
        sampling: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        chat: bool = True,
        use_draft: bool = True,
        policy: Policy | None = None,
    ) -> list[GenerationResult]:
        """`generate` for every prompt, up to `max_batch` decoding together; results in prompt order."""
        engine = self.batch_engine(max_batch, policy=policy, use_draft=use_draft)
        requests = [
            self.batch_request(p, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop, chat=chat)
            for p in prompts
        ]
        for request in requests:
            engine.submit(request)
        outcomes = {}
        while not engine.idle:
            for outcome in engine.step():
                outcomes[id(outcome.request)] = outcome
        results = []
        for request in requests:
            o = outcomes[id(request)]
            results.append(
                self._result(
                    o.trace,
                    request.prompt_ids,
                    request.stop,
                    use_draft=engine.drafter is not None,
                    decode_seconds=o.finished_at - o.started_at,
                )
            )
        return results

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def encode_text(tokenizer: Any, prompt: str, *, chat: bool = True) -> list[int]:
    """Prompt text -> token ids as `SpeculativeDecoder.encode` makes them: the chat template (a user turn
    and the generation prompt) when `chat` and the tokenizer has one, else the text as it is."""
    if tokenizer is None:
        raise ConfigError("the target has no tokenizer: pass token ids instead of text")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def generate(
    target: str | Path | LoadedTarget,
    draft: str | Path | None,
    prompt: str | Sequence[int],
    *,
    spec: SpecArgs = DEFAULT_SPEC,
    max_new_tokens: int = 128,
    sampling: SamplingParams = SamplingParams(),
    dtype: str = "float32",
    device: str = "cpu",
) -> GenerationResult:
    """One-shot convenience: load, then `SpeculativeDecoder.generate`."""
    decoder = SpeculativeDecoder.load(target, draft, spec=spec, dtype=dtype, device=device)
    return decoder.generate(prompt, max_new_tokens=max_new_tokens, sampling=sampling)
