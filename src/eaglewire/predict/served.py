"""Prediction on the served text: the offline replay over the very tokens the engine generated.

The held-out prediction (`eaglewire.predict.predictor`) replays decoding over held-out records while
tau is measured on the bench's prompts, so a gap between them is either *distribution* (held-out
answers are not the served prompts' answers) or *numerics* (the replay's target is transformers'
forward, the engine's the fast runtime; bf16 on a GPU). This prediction takes the first away: after
a speculative setting decoded a prompt set, every prompt + the token ids the engine generated (not
re-tokenized text) becomes a record with the loss mask on the generated tokens, and one batched
`eaglewire.predict.evaluation.evaluate_draft` runs on them, with the online target side (the bench's
target, in its dtype) and the draft as `eaglewire eval` runs it (float32 weights under the
evaluation's autocast: bf16 on CUDA). It is then replayed with the setting's chain over the whole
generated text (horizon = the tokens generated):

* served prediction vs measured: numerics (or a serving bug) alone, the text being the same. In
  float32 the two are equal, round for round (`tests/unit/predict/test_served_prediction.py`; the
  replay itself: `tests/unit/predict/test_replay_matches_engine.py`).
* held-out prediction vs served prediction: distribution alone, both being the same replay.

Trees: the engine's tree is dynamic (reranked per round by the draft's scores), and on a greedy
text the verification of any tree is known in advance, so a tree's prediction decodes the served
text with the engine's own drafter over `predict.text_replay.TextRunner` (the text's verdicts and the
target's teacher-forced aux states): the dynamic tree itself, no static approximation. In float32
it equals the engine's rounds too (the CPU test below); on the H200's MT-bench text it came within
1-2% where the static tree of `predictor.tree_for_spec` was 6-8% low (log §2p). The
held-out prediction decodes trees the same way over the held-out answers (`predict.heldout_trees`).

The cut at the end of the text (`rounds_within_text`, the rule of the replay test): the engine's last
round may verify drafts past max_new_tokens (or past eos); the record has no labels there, so the
replay cannot accept them. Measured rounds are compared cut the same way: each round's accepted
drafts at most the generated tokens left from where it starts. Only each prompt's last round can
change; `measured_tau` (as in the methods table, uncut) is reported beside `measured_tau_in_text`.
error = measured_tau_in_text - predicted_tau; relative error = error / predicted_tau.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import EaglewireError
from eaglewire.predict.predictor import PredictionRow

if TYPE_CHECKING:
    from eaglewire.contract.contract import Contract
    from eaglewire.data.types import TokenizedRecord
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.predict.evaluation import EvalResult
    from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)


class ServedRun(Protocol):
    """What the served prediction reads of one prompt's decode (`eaglewire.bench.results.PromptRun`)."""

    @property
    def prompt_id(self) -> str: ...

    @property
    def token_ids(self) -> Sequence[int]: ...  # [G] the generated ids

    @property
    def accepted_per_round(self) -> Sequence[int]: ...

    @property
    def emitted_per_round(self) -> Sequence[int]: ...


class ServedMethod(Protocol):
    """What it reads of one speculative setting's measurement (`eaglewire.bench.results.MethodResult`)."""

    @property
    def runs(self) -> Sequence[ServedRun]: ...

    @property
    def tau(self) -> float | None: ...


BATCH_TOKENS = 8192  # tokens per evaluation forward (rows of the longest record, packed)
CHAIN_METHOD = "replay, chain"
TREE_METHOD = "replay of the dynamic tree: the engine's drafter over the served text (predict.text_replay)"


def rounds_within_text(
    accepted_per_round: Sequence[int], emitted_per_round: Sequence[int], text_tokens: int
) -> list[int]:
    """The engine's accepted drafts per round, each cut at the end of a generated text of
    `text_tokens` tokens: min(accepted, text_tokens - the round's first token index) (see the module
    docstring; the rule of `tests/unit/predict/test_replay_matches_engine.py`)."""
    if len(accepted_per_round) != len(emitted_per_round):
        raise ValueError(
            f"rounds: {len(accepted_per_round)} accepted counts but {len(emitted_per_round)} emitted counts"
        )
    out, start = [], 0
    for accepted, emitted in zip(accepted_per_round, emitted_per_round, strict=True):
        out.append(min(int(accepted), text_tokens - start))
        start += int(emitted)
    return out


@dataclass(frozen=True)
class RoundStats:
    """Rounds of greedy speculative decoding: tau = tokens / rounds, per-position acceptance [D]."""

    rounds: int
    tokens: int
    per_position_acceptance: list[float]  # [D] fraction of rounds that accepted >= j drafts, j = 1..D

    @property
    def tau(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    @classmethod
    def from_accepted(cls, accepted: Sequence[int], depth: int) -> RoundStats:
        """Rounds that accepted `accepted[i]` drafts each (emitting accepted + 1 tokens)."""
        rounds = len(accepted)
        per_position = [
            sum(n >= j for n in accepted) / rounds if rounds else 0.0 for j in range(1, depth + 1)
        ]
        return cls(rounds, sum(n + 1 for n in accepted), per_position)


def measured_within_text(runs: Sequence[ServedRun], depth: int) -> RoundStats:
    """The engine's rounds over every prompt of a method, each cut at the end of its generated text."""
    accepted = [
        n
        for r in runs
        for n in rounds_within_text(r.accepted_per_round, r.emitted_per_round, len(r.token_ids))
    ]
    return RoundStats.from_accepted(accepted, depth)


def served_records(prompt_ids: Sequence[Sequence[int]], runs: Sequence[ServedRun]) -> list[TokenizedRecord]:
    """One record per prompt: its ids + the generated ids, the loss mask on the generated ones."""
    from eaglewire.data.types import TokenizedRecord

    if len(prompt_ids) != len(runs):
        raise ValueError(f"{len(runs)} runs for {len(prompt_ids)} prompts")
    records = []
    for prompt, run in zip(prompt_ids, runs, strict=True):
        ids = torch.tensor([*prompt, *run.token_ids], dtype=torch.long)  # [T]
        mask = torch.zeros(len(ids), dtype=torch.bool)  # [T]
        mask[len(prompt) :] = True
        records.append(TokenizedRecord(f"served:{run.prompt_id}", ids, mask))
    return records


def evaluate_served(
    target: LoadedTarget,
    draft: Eagle3Draft,
    contract: Contract,
    records: Sequence[TokenizedRecord],
    *,
    num_steps: int,
    precision: str = "auto",
) -> EvalResult:
    """`evaluate_draft` (online target side, per-position ranks kept) over `records`, packed into rows
    as long as the longest record, BATCH_TOKENS tokens per forward. `draft` is used as given, under
    `precision`'s autocast (`objective.autocast_for`: 'auto' is bf16 on CUDA, float32 elsewhere)."""
    from eaglewire.predict.evaluation import evaluate_draft
    from eaglewire.train.target_side import OnlineTarget

    longest = max(len(r.input_ids) for r in records)
    side = OnlineTarget(target, contract, draft.get_buffer("draft_to_target"))
    return evaluate_draft(
        draft,
        contract,
        side,
        list(records),
        num_steps=num_steps,
        batch_size=max(1, BATCH_TOKENS // longest),
        max_length=longest,
        pack=True,
        device=target.device,
        precision=precision,
    )


@dataclass(frozen=True)
class ServedPrediction:
    """One speculative setting: the replay over the text it served vs the engine's rounds."""

    method: str  # "eagle-chain" | "eagle-tree"
    setting: dict[str, int]  # num_steps, topk, num_draft_tokens
    measured_tau: float | None  # the engine's, every round whole (the methods table's tau)
    measured: RoundStats | None  # the engine's rounds cut at the end of the generated text
    predicted: RoundStats | None  # the replay over prompt + generated tokens
    heldout_predicted_tau: float | None = None  # the held-out prediction, where the bench made one
    prediction_method: str = ""  # CHAIN_METHOD | TREE_METHOD
    prompts: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0  # the evaluation's wall time (shared by settings that served the same text), plus
    # a tree's own replay
    note: str = ""  # why a prediction is missing, or what it approximates
    heldout_prediction_method: str = ""  # the held-out prediction's `PredictionRow.prediction_method`

    @property
    def measured_tau_in_text(self) -> float | None:
        return None if self.measured is None else self.measured.tau

    @property
    def predicted_tau(self) -> float | None:
        return None if self.predicted is None else self.predicted.tau

    @property
    def error(self) -> float | None:
        m, p = self.measured_tau_in_text, self.predicted_tau
        return None if m is None or p is None else m - p

    @property
    def relative_error(self) -> float | None:
        e, p = self.error, self.predicted_tau
        return None if e is None or not p else e / p

    @property
    def exact(self) -> bool:
        """Replay and engine agree on rounds, tokens and per-position acceptance."""
        return self.measured is not None and self.measured == self.predicted

    def to_json(self) -> dict[str, Any]:
        m, p = self.measured, self.predicted
        return {
            "method": self.method,
            **self.setting,
            "measured_tau": self.measured_tau,
            "measured_tau_in_text": self.measured_tau_in_text,
            "served_predicted_tau": self.predicted_tau,
            "error": self.error,
            "relative_error": self.relative_error,
            "heldout_predicted_tau": self.heldout_predicted_tau,
            "heldout_prediction_method": self.heldout_prediction_method,
            "measured_per_position_acceptance": [] if m is None else m.per_position_acceptance,
            "served_predicted_per_position_acceptance": [] if p is None else p.per_position_acceptance,
            "measured_rounds": None if m is None else m.rounds,
            "served_predicted_rounds": None if p is None else p.rounds,
            "measured_tokens_in_text": None if m is None else m.tokens,
            "served_predicted_tokens": None if p is None else p.tokens,
            "rounds_match": self.exact,
            "prediction_method": self.prediction_method,
            "prompts": self.prompts,
            "generated_tokens": self.generated_tokens,
            "seconds": self.seconds,
            "note": self.note,
        }


@dataclass
class ServedInputs:
    """What the served prediction needs from a bench run."""

    target: LoadedTarget
    draft: Eagle3Draft  # evaluated as given (pass a float32 copy: `float32_draft`)
    contract: Contract
    prompt_ids: list[list[int]]
    settings: Mapping[str, tuple[SpecArgs, ServedMethod]]  # method -> its spec and measured result
    heldout: list[PredictionRow] = field(default_factory=list)


def float32_draft(draft: Eagle3Draft) -> Eagle3Draft:
    """A float32 eval-mode copy (the engine's draft is in the target's dtype and stays untouched)."""
    return copy.deepcopy(draft).float().eval().requires_grad_(False)


def _heldout(rows: Sequence[PredictionRow], spec: SpecArgs) -> dict[str, Any]:
    """The held-out prediction of `spec`'s setting as ServedPrediction fields (none where not made)."""
    setting = {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens}
    row = next((r for r in rows if r.setting == setting), None)
    if row is None:
        return {}
    return {"heldout_predicted_tau": row.predicted_tau, "heldout_prediction_method": row.prediction_method}


def _predict_chain(result: EvalResult, spec: SpecArgs) -> RoundStats:
    replay = result.replay_chain(spec.num_steps)
    per_position = list(replay.per_position_acceptance)
    per_position += [0.0] * (spec.num_steps - len(per_position))
    return RoundStats(replay.rounds, replay.tokens, per_position)


def _predict_tree(
    inputs: ServedInputs, runs: Sequence[ServedRun], spec: SpecArgs, auxes: list[torch.Tensor]
) -> RoundStats:
    """The engine's dynamic tree decoding the served text (`predict.text_replay`): its rounds as
    `measured_within_text` counts the engine's (the replay accepts nothing past the text)."""
    from eaglewire.predict.text_replay import replay_on_texts

    texts = [(p, r.token_ids) for p, r in zip(inputs.prompt_ids, runs, strict=True)]
    replay = replay_on_texts(inputs.draft, spec, texts, auxes, vocab_size=inputs.target.vocab_size,
                             num_layers=inputs.target.num_layers)  # fmt: skip
    return RoundStats.from_accepted(replay.accepted_per_round, spec.num_steps)


def served_predictions(inputs: ServedInputs) -> list[ServedPrediction]:
    """One row per setting of `inputs.settings`; one evaluation per distinct served text (settings that
    generated the same tokens, as chains and trees do in float32, share it). A setting whose
    evaluation fails (e.g. a record longer than the target's sliding window) gets a note instead."""
    groups: dict[tuple[tuple[int, ...], ...], list[str]] = {}
    for method, (_, result) in inputs.settings.items():
        groups.setdefault(tuple(tuple(r.token_ids) for r in result.runs), []).append(method)
    rows: dict[str, ServedPrediction] = {}
    for methods in groups.values():
        specs = {m: inputs.settings[m][0] for m in methods}
        runs = inputs.settings[methods[0]][1].runs
        base = {
            m: ServedPrediction(
                m,
                {"num_steps": s.num_steps, "topk": s.topk, "num_draft_tokens": s.num_draft_tokens},
                inputs.settings[m][1].tau,
                measured_within_text(inputs.settings[m][1].runs, s.num_steps),
                None,
                **_heldout(inputs.heldout, s),
                prompts=len(runs),
                generated_tokens=sum(len(r.token_ids) for r in runs),
            )
            for m, s in specs.items()
        }
        start = time.perf_counter()
        chains = [m for m, sp in specs.items() if sp.is_chain]
        try:
            evaluation = None
            if chains:
                records = served_records(inputs.prompt_ids, runs)
                steps = max(specs[m].num_steps for m in chains)
                evaluation = evaluate_served(
                    inputs.target, inputs.draft, inputs.contract, records, num_steps=steps
                )
            auxes = []
            if len(chains) < len(specs):
                from eaglewire.predict.text_replay import text_aux

                auxes = [text_aux(inputs.target, inputs.contract, [*p, *r.token_ids])
                         for p, r in zip(inputs.prompt_ids, runs, strict=True)]  # fmt: skip
        except (EaglewireError, RuntimeError) as e:  # torch's errors (OOM, CUDA) are RuntimeErrors
            why = f"served prediction failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("%s (%s)", why, ", ".join(methods))
            rows.update({m: replace(base[m], note=why) for m in methods})
            continue
        shared = time.perf_counter() - start
        for m, spec in specs.items():
            t0 = time.perf_counter()
            try:
                if spec.is_chain:
                    assert evaluation is not None
                    predicted, how = _predict_chain(evaluation, spec), CHAIN_METHOD
                else:
                    predicted, how = _predict_tree(inputs, runs, spec, auxes), TREE_METHOD
            except (EaglewireError, RuntimeError) as e:  # torch's errors (OOM, CUDA) are RuntimeErrors
                # A prediction is a check beside the measurement: its failure must not lose the sweep.
                log.warning("%s: served prediction failed: %s: %s", m, type(e).__name__, e)
                rows[m] = replace(base[m], note=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                  seconds=shared)  # fmt: skip
                continue
            row = replace(base[m], predicted=predicted, prediction_method=how,
                          seconds=shared + time.perf_counter() - t0)  # fmt: skip
            rows[m] = row
            log.info("%s: tau measured in text %s, predicted on the served text %s (%d prompts, %.1f s)",
                     m, row.measured_tau_in_text, row.predicted_tau, len(runs), row.seconds)  # fmt: skip
    return [rows[m] for m in inputs.settings]


def served_summary(rows: Sequence[ServedPrediction]) -> dict[str, Any]:
    """Settings compared, how many matched round for round, mean / max |relative error|."""
    rel = [r.relative_error for r in rows if r.relative_error is not None]
    if not rel:
        return {"settings_compared": 0}
    return {
        "settings_compared": len(rel),
        "settings_exact": sum(r.exact for r in rows),
        "mean_abs_relative_error": sum(abs(x) for x in rel) / len(rel),
        "max_abs_relative_error": max(abs(x) for x in rel),
    }


def served_markdown(rows: Sequence[ServedPrediction]) -> str:
    """The table bench.md shows under "Prediction on the served text"."""

    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    def acc(stats: RoundStats | None) -> str:
        return "-" if stats is None else " ".join(f"{a:.2f}" for a in stats.per_position_acceptance)

    lines = [
        "| method | setting | measured tau | measured in text | predicted on served text | error | relative "
        "| rounds measured / predicted | held-out predicted | acceptance per position, measured in text "
        "| acceptance per position, predicted |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        s = r.setting
        setting = f"{s['num_steps']}/{s['topk']}/{s['num_draft_tokens']}"
        rel = "-" if r.relative_error is None else f"{100 * r.relative_error:+.1f}%"
        pred = f(r.predicted_tau) if r.predicted is not None else f"- ({r.note})"
        rounds = f"{r.measured.rounds if r.measured else '-'} / {r.predicted.rounds if r.predicted else '-'}"
        lines.append(
            f"| {r.method} | {setting} | {f(r.measured_tau)} | {f(r.measured_tau_in_text)} | {pred} | "
            f"{f(r.error, '+.3f')} | {rel} | {rounds} | {f(r.heldout_predicted_tau)} | {acc(r.measured)} | "
            f"{acc(r.predicted)} |"
        )
    lines += [
        "",
        "setting = num_steps/topk/num_draft_tokens. Predicted: `evaluate_draft` replayed over each prompt + the "
        "token ids the engine generated; measured in text: the engine's rounds cut at the end of the generated "
        "text, as the replay must be (measured tau counts the last round whole); error = measured in text - "
        "predicted. Against the held-out prediction (its method per setting in the offline prediction table) "
        "the difference is distribution; against measured, numerics (see eaglewire.predict.served).",
    ]
    if any(r.setting["topk"] != 1 and r.predicted is not None for r in rows):
        lines.append(f"Trees: {TREE_METHOD}.")
    return "\n".join(lines)
