"""Predicted acceptance length (tau) of chains and static trees from a held-out evaluation's ranks.

The evaluation (`eaglewire.train.evaluate`: the training-time-test forward over held-out rows)
records, for every position t and step s, the rank of the target's argmax token among the draft's
logits (0 = the draft's top-1 is that token). `EvalResult` keeps those ranks and predicts from them;
`evaluate_draft` / `run_eval` evaluate a saved draft (what `eaglewire eval` calls).

Prediction (greedy verification; tau counts the bonus token, as SGLang/vLLM/EAGLE do; the pure
math, trees, accepted drafts and replay, lives in `eaglewire.predict.replay`), by
**replay** (the default: `EvalResult.tau_chain`, `EvalResult.tau_tree`, `replay_tree`):

  A tree is a set of nodes, each a path of ranks (r_1, ..., r_d) from the root, e.g. (0,), (1,),
  (0, 0): "the draft's best token, its second best, and the best continuation of the first"; a
  chain of k draft tokens is the tree (0,), (0, 0), ..., (0,)*k. Step s at row t drafts token s+1
  of a round that starts right after x[t+1] was emitted, fed the true tokens before it, which is
  what serving computes when the earlier drafts were accepted; so the drafts a round starting at
  row t accepts are n_t = the longest prefix of the true path (ranks[t, 0], ranks[t, 1], ...) that
  is a node of the tree (every step of it valid). Replay decodes each response (a run of rows
  valid at step 0 inside one record) the way an engine does:

      t = first row of the response       # its step 0 predicts the response's first token: the
                                          # engine's first round drafts it (prefill stops before the
                                          # prompt's last token, which is the first round's root)
      while t is in the response:  n = n_t;  emit n + 1 tokens (bonus included);  t += n + 1

  tau_pred = tokens emitted / rounds = 1 + mean of n_t over the rows a decoder *visits*, and
  per-position acceptance[j-1] = fraction of rounds with n_t >= j (the engine's definition).
  Rounds are not a uniform sample of positions: a round starts right after the previous round's
  first rejected draft, and draft errors cluster (hard stretches of text get many short rounds,
  easy stretches few long ones), so the visited rows are harder than the average row.

The **position-averaged** formula (`position_averaged_tau_chain`, `position_averaged_tau_tree`;
what the prediction used to be, kept for comparison) averages over *all* rows instead:

* chain of k: tau = 1 + sum_{s=1..k} prod_{j<=s} cond_acc_j, where cond_acc_j is the accuracy
  of draft token j over the positions whose tokens 1..j-1 were all right
  (`EvalResult.summary()["cond_acc"][j-1]`); each product is P(the first s drafts are accepted).
* tree: tau = 1 + sum_nodes P(node), with
  P(r_1..r_d) = prod_j  #{positions valid at depth j whose ranks at depths < j are r_1..r_{j-1}
                          and whose rank at depth j is r_j} / #{... the same without the last condition}.
  For the chain (0,)*s this is exactly the product of cond_acc above. It is 1 + the mean of n_t
  over *every* row valid at step 0 (up to the rows near a response's end, whose deeper steps are
  not counted), and overestimates live tau when errors cluster (measured on an H200: chain of 5
  predicted 3.07 position-averaged, measured 2.09).

Assumptions (what makes it a prediction, not a measurement): the draft at depth j is fed the
ground-truth token, which equals the accepted token when the data is the target's own greedy
output (regenerate it); sibling order equals the draft's ranking, as in EAGLE's top-k expansion;
prompts in the eval set resemble the served ones; every response is served as its own request
(its prompt = the record up to it, prefilled at once). Under these a static tree's replay is exact:
`tests/unit/predict/test_replay_matches_engine.py` decodes with the engine (float32, both round
loops) and replays the record of that very text, round for round. The one round it cannot see
whole is one whose drafts run past the end of the record's text (a decoder verifies drafts past
its max_new_tokens; the replay has no labels there), so such a last round is cut at the text's end.
A dynamic tree (SGLang's topk/num_steps/num_draft_tokens, reranked per round by draft scores) is
approximated here by the static tree of the same nodes (`eaglewire.predict.heldout_trees` decodes it
instead, with the engine's drafter over the same responses); responses truncated at max_length end early.
With `EvalResult.horizon` (`eaglewire eval --horizon`; the bench and the quickstart use their
max_new_tokens) rounds start only within the first `horizon` tokens of each response, as a decoder
stopping there: long regenerated answers often end in loops that are easy to draft.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from eaglewire.errors import ConfigError
from eaglewire.predict.replay import (
    Replay,
    chain_tree,
    predicted_tau_chain,
    predicted_tau_tree,
    replay_tree,
    response_spans,
    response_turns,
    validate_tree,
)
from eaglewire.target.loading import LoadedTarget
from eaglewire.train.batches import RecordSource
from eaglewire.train.distributed import DistContext
from eaglewire.train.evaluate import EvalRanks, eval_rows, evaluate_model
from eaglewire.train.loss import OUT_OF_VOCAB_RANK
from eaglewire.train.target_side import TargetSide

log = logging.getLogger(__name__)


FIRST_ANSWER = 1  # `answer` of every record's first response: what a benchmark prompt's answer is


@dataclass
class EvalResult(EvalRanks):
    """An evaluation's measurements (`EvalRanks`) and the predictions replayed from its ranks."""

    # Replay only the first `horizon` tokens of each response, as a decoder whose max_new_tokens is
    # that (long regenerated answers often end in easy loops a short benchmark never reaches);
    # None: whole responses. `dataclasses.replace(result, horizon=n)` gives a result with its own cache.
    horizon: int | None = None
    # Replay only every record's `answer`-th response (1: first answers, what a benchmark prompt's
    # answer is: later answers of multi-turn conversations are easier to draft); None: all of them.
    answer: int | None = None
    _replays: dict[tuple[tuple[int, ...], ...], Replay] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def of(cls, measured: EvalRanks) -> EvalResult:
        """The predictions over what `evaluate_model` measured (whole responses, every answer)."""
        return cls(**{f.name: getattr(measured, f.name) for f in fields(EvalRanks)})

    @property
    def prediction_method(self) -> str:
        """What `tau_chain` / `tau_tree` compute (the bench prediction check reports it)."""
        return "replay"

    def summary(self) -> dict[str, Any]:
        """The count-table metrics; with per-position ranks also the predictions for every chain length
        k = 1..S: `predicted_tau_chain` (replay), `position_averaged_tau_chain`, and the replayed
        per-position acceptance and rounds of the longest chain."""
        out = super().summary()
        if self.has_positions and self.num_steps > 0:
            ks = range(1, self.num_steps + 1)
            longest = self.replay_chain(self.num_steps)
            out["predicted_tau_chain"] = [self.tau_chain(k) for k in ks]
            out["position_averaged_tau_chain"] = [self.position_averaged_tau_chain(k) for k in ks]
            out["predicted_per_position_acceptance"] = longest.per_position_acceptance
            out["replay_rounds"] = longest.rounds
            by_turn = {k: self.replay_chain_by_turn(k) for k in ks}
            # {turn: [tau of the chain of k for k = 1..S]} and the responses' rounds at k = S
            out["predicted_tau_chain_by_turn"] = {
                str(t): [by_turn[k][t].tau for k in ks] for t in by_turn[self.num_steps]
            }
            out["replay_rounds_by_turn"] = {str(t): r.rounds for t, r in by_turn[self.num_steps].items()}
        return out

    def without_vocab_misses(self) -> EvalResult:
        """This evaluation as if every label outside the draft vocabulary had been the draft's top-1:
        its replayed taus bound what a vocabulary holding those tokens (`--draft-vocab-size`) could
        add. An upper bound: the draft would not draft every such token right."""
        self._require_positions()
        misses = self.ranks == OUT_OF_VOCAB_RANK
        return replace(self, ranks=torch.where(misses, torch.zeros_like(self.ranks), self.ranks))

    def out_of_vocab_share(self) -> list[float]:
        """Per step: the share of valid rows whose label is outside the draft vocabulary (NaN: none valid)."""
        self._require_positions()
        misses = (self.ranks == OUT_OF_VOCAB_RANK) & self.valid  # [N, S]
        rows = self.valid.sum(0)
        return [float(m) / int(n) if int(n) else math.nan for m, n in zip(misses.sum(0), rows, strict=True)]

    def replay_tree(self, tree: Sequence[Sequence[int]]) -> Replay:
        """The replayed decoding of a static tree (cached per tree)."""
        nodes = tuple(validate_tree(tree))
        self._require_positions()
        if nodes not in self._replays:
            self._replays[nodes] = replay_tree(
                self.ranks, self.valid, self._slices(), nodes, self.horizon, self.answer
            )
        return self._replays[nodes]

    def _require_positions(self) -> None:
        if not self.has_positions:
            raise ConfigError(
                "this evaluation kept no per-position ranks (evaluate_model(..., with_ranks=False)); "
                "replay and tree predictions need them",
                fix="evaluate with with_ranks=True (eaglewire eval / evaluate_draft do)",
            )

    def _slices(self) -> tuple[int, ...]:
        """Rows of `ranks` per record slice (one slice when not recorded)."""
        return self.segments if self.segments is not None else (int(self.ranks.shape[0]),)

    def replay_chain_by_turn(self, k: int) -> dict[int, Replay]:
        """The chain-of-k replay split by answer: turn 1 = every record's first answer (what a
        benchmark prompt's answer is), turn 2 the next, ... A held-out set of multi-turn records
        predicts first answers only as well as its turns resemble each other: this says."""
        if k < 1 or k > self.num_steps:
            raise ConfigError(f"chain length k={k}: expected 1..{self.num_steps}")
        self._require_positions()
        segments = self._slices()
        turns = sorted(set(response_turns(response_spans(self.valid[:, 0], segments), segments)))
        return {t: replace(self, answer=t).replay_chain(k) for t in turns}

    def replay_chain(self, k: int) -> Replay:
        if k < 0 or k > self.num_steps:
            raise ConfigError(
                f"chain length k={k}: expected 0..{self.num_steps} (accuracy measured for {self.num_steps} steps)"
            )
        if k == 0:
            return Replay(1.0, 0, 0, [])
        return self.replay_tree(chain_tree(k))

    def tau_chain(self, k: int) -> float:
        """Predicted tau of a chain of k drafts (replay, the default prediction)."""
        return self.replay_chain(k).tau

    def tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        """Predicted tau of a static tree (replay, the default prediction)."""
        return self.replay_tree(tree).tau

    def position_averaged_tau_chain(self, k: int) -> float:
        """The position-averaged chain formula (module docstring), from the count table alone."""
        cond_acc: Any = self.counts.summary(self.step_weights)["cond_acc"]
        return predicted_tau_chain(cond_acc, k)

    def position_averaged_tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        """The position-averaged tree formula (module docstring)."""
        return predicted_tau_tree(self.ranks, self.valid, tree)


def check_live_target(draft_contract: Any, live: Any) -> None:
    """The target evaluated with (`live`: the contract of the states it computes) is the draft's own.
    Both sides are named as what they are: the draft's contract.json, and the target given by --target."""
    from eaglewire.contract.contract import contract_diff
    from eaglewire.errors import ContractMismatchError

    diffs = contract_diff(draft_contract, live, names=("draft contract", "--target"))
    if diffs:
        trained_on = draft_contract.target.name
        raise ContractMismatchError(
            f"--target {live.target.name}: not the target the draft was trained for:\n  " + "\n  ".join(diffs),
            fix=(f"pass the draft's own target, --target {trained_on} (its contract.json's target.name)"
                 if trained_on else "pass the draft's own target with --target (its contract.json names it)")
            + ", or retrain the draft on this target",
        )  # fmt: skip


def evaluate_draft(
    draft: Any,
    draft_contract: Any,
    target_side: TargetSide,
    data: RecordSource[Any],
    *,
    num_steps: int,
    batch_size: int = 1,
    max_length: int = 2048,
    pack: bool = True,
    max_records: int = 0,
    device: str | torch.device = "cpu",
    precision: str = "auto",
    step_weight_decay: float = 0.8,
) -> EvalResult:
    """Evaluate a trained draft (an Eagle3Draft) on held-out records in one process.

    Checks the data's contract against the draft's first (ContractMismatchError names both).
    """
    from eaglewire.train.objective import TTTObjective, autocast_for
    from eaglewire.train.target_side import OnlineTarget, check_data_contract, check_dataset_identity

    if isinstance(target_side, OnlineTarget):
        # tokenized data: the live target computes the states, so it is what must be the draft's target,
        # and the tokens must come from the draft's tokenizer
        check_live_target(draft_contract, target_side.data_contract)
        check_dataset_identity(data, draft_contract, name="--data")
    else:
        check_data_contract(draft_contract, target_side.data_contract)
    target_side.verify(draft_contract)
    dev = torch.device(device)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=dev)
    # the new wrapper takes the draft's mode, which evaluate_model restores afterwards (a fresh
    # module is in train mode: restoring that would leave the caller's draft in train mode)
    model = TTTObjective(draft.to(dev), num_steps).train(draft.training)
    rows = eval_rows(data, max_length=max_length, pack=pack, max_records=max_records)
    measured = evaluate_model(
        model,
        target_side,
        data,
        rows,
        ctx=ctx,
        batch_size=batch_size,
        num_steps=num_steps,
        step_weights=[step_weight_decay**s for s in range(num_steps)],
        autocast=autocast_for(precision, dev),
    )
    return EvalResult.of(measured)


def run_eval(
    *,
    draft_dir: Path,
    target: str,
    data_dir: Path,
    num_steps: int,
    batch_size: int = 1,
    max_length: int = 2048,
    max_records: int = 0,
    device: str | None = None,
    target_dtype: str | None = None,
    loaded: LoadedTarget | None = None,
) -> EvalResult:
    """Offline evaluation of a saved draft on a tokenized dataset or a shard directory. `loaded`: the
    target already loaded (tokenized data runs it instead of loading `target` again; shards need
    only its head, loaded from `target`)."""
    from eaglewire.draft.io import load_draft
    from eaglewire.train.run import default_target_dtype, make_target_side, open_data

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    draft, contract = load_draft(draft_dir, device=dev)
    data = open_data(data_dir)
    side = make_target_side(
        data, target, contract, draft, device=dev, target_dtype=target_dtype or default_target_dtype(dev),
        loaded=loaded,
    )  # fmt: skip
    return evaluate_draft(
        draft,
        contract,
        side,
        data.records,
        num_steps=num_steps,
        batch_size=batch_size,
        max_length=max_length,
        max_records=max_records,
        device=dev,
    )
