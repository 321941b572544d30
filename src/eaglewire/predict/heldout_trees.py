"""Held-out prediction of the engine's dynamic trees: its own drafter decoding the held-out answers.

The trainer's evaluation (`eaglewire.predict.evaluation.EvalResult`) predicts a chain by replaying the
draft's ranks along each held-out answer (exact on the target's greedy text), but the engine's tree
is dynamic (reranked every round by the draft's scores), and a static tree of the same settings
(`predictor.tree_for_spec`) was 5-8% below the trees measured on the H200. The held-out records are the target's own answers
(the quickstart regenerates them greedily: `regen_temperature` 0 in every preset; `eaglewire data
regenerate` samples at 0.7 unless given `--temperature 0`), so the text replay the served prediction
uses (`predict.text_replay`) serves here too: every held-out record's answer (the `answer`-th one, as
the evaluation replays: 1 = the first, what a benchmark prompt's answer is; None = every answer)
becomes a (prompt, answer) text, the prompt being the record's tokens before it, and the engine's
`SpeculativeDecoder` decodes it over a `TextRunner` for `horizon` tokens (the bench's
max_new_tokens), its aux states from one teacher-forced forward of the target over the text.

On a greedy answer this is the engine's own rounds (`tests/unit/predict/test_heldout_trees.py` finds
them exactly in float32). Where an answer is not the target's greedy text (re-tokenized, sampled, or
regenerated in bf16 in batches), it predicts what the evaluation's replay predicts under the same
assumption: the answer's tokens are the ones the target accepts.

Each answer is kept to `horizon` + the evaluation's depth tokens: a round starting before the
horizon verifies up to that many drafts past it (the engine's last round does, and its tau counts
them), so the text must hold them. A record is skipped, counted by reason and logged, when it has
no such answer, when the answer starts the record (no prompt to prefill), or when the text is
longer than the target's `max_position_embeddings`.

`evaluate_predictor` runs the evaluation and wraps it (`eaglewire bench --eval-data`, `--sweep`'s
prediction check, `benchmarks/draft_levers.py`); `heldout_tree_predictor` wraps an evaluation that
already ran (the quickstart's decode stage, `eaglewire eval --tree NUM_STEPS,TOPK,NUM_DRAFT_TOKENS`).
Replaying a setting costs a decode of every answer (one draft pass per round, no target forward).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.target.loading import LoadedTarget

if TYPE_CHECKING:
    from eaglewire.contract.contract import Contract
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.predict.evaluation import EvalResult
    from eaglewire.predict.text_replay import TextReplay
    from eaglewire.train.batches import RecordSource

log = logging.getLogger(__name__)


def answer_spans(loss_mask: torch.Tensor) -> list[tuple[int, int]]:
    """loss_mask [T] bool (True on assistant tokens) -> the [start, end) token span of every answer
    (a maximal run of assistant tokens), in order."""
    padded = torch.nn.functional.pad(loss_mask.reshape(-1).to(torch.int8), (1, 1))  # [T+2] False each side
    edges = padded[1:] - padded[:-1]  # [T+1] +1 where an answer starts, -1 one past its last token
    starts = (edges == 1).nonzero()[:, 0].tolist()
    ends = (edges == -1).nonzero()[:, 0].tolist()
    return [(int(s), int(e)) for s, e in zip(starts, ends, strict=True)]


@dataclass(frozen=True)
class HeldoutText:
    """One held-out answer as the decoder sees it: the prompt is prefilled, the answer decoded."""

    record_id: str
    prompt: tuple[int, ...]  # [P] the record's tokens before the answer
    answer: tuple[int, ...]  # [G] the answer, kept to horizon + depth tokens


@dataclass
class HeldoutTexts:
    """The answers a dynamic tree is replayed over, the target's aux states over each, and the
    records left out (reason -> how many)."""

    texts: list[HeldoutText]
    auxes: list[torch.Tensor]  # one [P + G, A*Ht] per text, in the contract's aux order
    skipped: dict[str, int] = field(default_factory=dict)


def collect_heldout_texts(
    records: RecordSource[Any],
    target: LoadedTarget,
    contract: Contract,
    *,
    answer: int | None,
    keep_tokens: int | None,
    max_records: int = 0,
) -> HeldoutTexts:
    """The `answer`-th answer (1-based; None: every answer) of each of the first `max_records` records
    (0: all), each kept to `keep_tokens` tokens (None: whole), with the aux of one teacher-forced
    forward of `target` over the record up to the last answer kept (see the module docstring)."""
    from eaglewire.predict.text_replay import text_aux

    limit = getattr(target.config, "max_position_embeddings", None)
    n = len(records) if max_records <= 0 else min(max_records, len(records))
    texts: list[HeldoutText] = []
    auxes: list[torch.Tensor] = []
    skipped: Counter[str] = Counter()
    for i in range(n):
        record = records[i]
        ids = record.input_ids.reshape(-1).long()  # [T]
        spans = answer_spans(record.loss_mask)
        if answer is not None:
            if len(spans) < answer:
                skipped[f"fewer than {answer} answer(s)"] += 1
                continue
            spans = [spans[answer - 1]]
        kept: list[tuple[int, int]] = []  # [start, end) of each answer as kept
        for start, end in spans:
            stop = end if keep_tokens is None else min(end, start + keep_tokens)
            if start == 0:
                skipped["the answer starts the record: no prompt to prefill"] += 1
            elif limit is not None and stop > int(limit):
                skipped[f"prompt + answer longer than the target's max_position_embeddings={limit}"] += 1
            else:
                kept.append((start, stop))
        if not kept:
            continue
        row = ids[: max(end for _, end in kept)].tolist()
        aux = text_aux(target, contract, row)  # [T', A*Ht]: causal, so each text's aux is a prefix
        for start, stop in kept:
            texts.append(HeldoutText(str(record.record_id), tuple(row[:start]), tuple(row[start:stop])))
            auxes.append(aux[:stop])
    if skipped:
        log.warning("held-out tree replay: %d answers of %d records skipped: %s", sum(skipped.values()), n,
                    "; ".join(f"{why}: {count}" for why, count in skipped.items()))  # fmt: skip
    log.info("held-out tree replay: %d answers of %d records", len(texts), n)
    return HeldoutTexts(texts, auxes, dict(skipped))


@dataclass
class HeldoutTreePredictor:
    """A held-out `TauPredictor` (`predict.predictor`) that also decodes an engine setting's dynamic
    tree over the held-out answers (`tau_dynamic_tree`); chains, static trees and the
    position-averaged formulas are the evaluation's. The texts and their aux are gathered at the
    first tree asked for (a chain-only bench never needs the target's extra forwards)."""

    evaluation: EvalResult  # its horizon and answer choose what is replayed
    draft: Eagle3Draft  # float32, eval mode, on the target's device
    contract: Contract  # the draft's: which aux states it reads
    target: LoadedTarget
    records: RecordSource[Any]  # the held-out records the evaluation ran on, in its order
    max_records: int = 0  # the evaluation's: the first this many records (0 = all)
    _texts: HeldoutTexts | None = field(default=None, init=False, repr=False)
    _replays: dict[SpecArgs, TextReplay] = field(default_factory=dict, init=False, repr=False)

    @property
    def prediction_method(self) -> str:
        return self.evaluation.prediction_method

    @property
    def depth(self) -> int:
        """The deepest draft the evaluation scored, and the deepest tree this predicts."""
        return self.evaluation.num_steps

    def summary(self) -> dict[str, Any]:
        return self.evaluation.summary()

    def tau_chain(self, k: int) -> float:
        return self.evaluation.tau_chain(k)

    def tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        """A static tree of rank paths, replayed by the evaluation."""
        return self.evaluation.tau_tree(tree)

    def position_averaged_tau_chain(self, k: int) -> float:
        return self.evaluation.position_averaged_tau_chain(k)

    def position_averaged_tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        return self.evaluation.position_averaged_tau_tree(tree)

    def texts(self) -> HeldoutTexts:
        if self._texts is None:
            horizon = self.evaluation.horizon
            self._texts = collect_heldout_texts(
                self.records, self.target, self.contract, answer=self.evaluation.answer,
                keep_tokens=None if horizon is None else horizon + self.depth, max_records=self.max_records,
            )  # fmt: skip
        return self._texts

    def replay_dynamic_tree(self, spec: SpecArgs) -> TextReplay:
        """The engine's rounds of `spec` over every held-out answer (cached per setting)."""
        from eaglewire.predict.text_replay import replay_on_texts

        if spec.num_steps > self.depth:
            raise ConfigError(
                f"tree depth {spec.num_steps} exceeds the {self.depth} steps evaluated",
                fix=f"evaluate with --num-steps {spec.num_steps}",
            )
        if spec not in self._replays:
            held = self.texts()
            if not held.texts:
                raise ConfigError(
                    "no held-out answer to replay the dynamic tree over: "
                    + ("; ".join(f"{why}: {count}" for why, count in held.skipped.items()) or "no records")
                )
            texts = [(t.prompt, t.answer) for t in held.texts]
            self._replays[spec] = replay_on_texts(
                self.draft, spec, texts, held.auxes, vocab_size=self.target.vocab_size,
                num_layers=self.target.num_layers, max_new_tokens=self.evaluation.horizon,
            )  # fmt: skip
        return self._replays[spec]

    def tau_dynamic_tree(self, spec: SpecArgs) -> float:
        return self.replay_dynamic_tree(spec).tau


def heldout_tree_predictor(
    evaluation: EvalResult, target: LoadedTarget, draft_dir: Path, data_dir: Path, *, max_records: int = 0
) -> HeldoutTreePredictor:
    """`evaluation` (of the draft in `draft_dir` on the held-out data in `data_dir`, its first
    `max_records` records) with the dynamic trees decoded over the same records by `target`."""
    from eaglewire.draft.io import load_draft
    from eaglewire.train.run import open_data

    draft, contract = load_draft(Path(draft_dir), device=target.device)  # float32, as the evaluation
    records = open_data(Path(data_dir)).records
    return HeldoutTreePredictor(evaluation, draft, contract, target, records, max_records)


def evaluate_predictor(
    draft_dir: Path,
    target: str | LoadedTarget,
    data_dir: Path,
    *,
    num_steps: int,
    max_records: int = 0,
    device: str | None = None,
    target_dtype: str | None = None,
    horizon: int | None = None,
    answer: int | None = None,
) -> HeldoutTreePredictor:
    """Run the offline evaluation (`predict.evaluation.run_eval`) on a held-out tokenized dataset or
    shard directory, and decode trees over the same records (`HeldoutTreePredictor`): a predictor of
    chains, static trees and dynamic trees. `target`: a loaded target (used for both, so it is loaded
    once), or what `load_target` takes (loaded here, `target_dtype` on `device`).
    `horizon`: replay only the first that many tokens of each response (the benchmark's
    max_new_tokens); `answer`: only each record's answer-th response (1: first answers; None: all,
    `EvalResult.answer`)."""
    from dataclasses import replace

    from eaglewire.predict.evaluation import run_eval
    from eaglewire.target.loading import load_target
    from eaglewire.train.run import default_target_dtype

    if isinstance(target, LoadedTarget):
        loaded = target
    else:
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        loaded = load_target(target, dtype=target_dtype or default_target_dtype(dev), device=dev)
    result = run_eval(
        draft_dir=Path(draft_dir),
        target=str(loaded.path),  # shard data loads only the target's head, from there
        data_dir=Path(data_dir),
        num_steps=num_steps,
        max_records=max_records,
        device=str(loaded.device),
        loaded=loaded,
    )
    evaluation = replace(result, horizon=horizon, answer=answer)
    return heldout_tree_predictor(
        evaluation, loaded, Path(draft_dir), Path(data_dir), max_records=max_records
    )
