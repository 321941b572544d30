"""Predicting an engine setting's tau offline, and checking it against the tau the engine measures.

The prediction comes from `eaglewire.predict.evaluation` (held-out data, no engine). The default is the
**replay** (module docstring there): greedy speculative decoding simulated over the held-out
responses from the evaluation's per-position draft ranks, tau = tokens emitted / verification
rounds. The older **position-averaged** formula (1 + the mean accepted drafts over *every* position)
is reported beside it (`position_averaged_tau`): rounds start right after a rejected draft and
draft errors cluster, so it overestimates the engine's tau (15-47% measured on an H200).

* an `EvalResult` (in process; `predict.heldout_trees.evaluate_predictor` runs the evaluation on a
  held-out dataset, and wraps it to decode dynamic trees too) replays chains and trees;
* a JSON summary (`eaglewire eval --json`, or any report with "cond_acc"): chains only, the replay
  when it carries "predicted_tau_chain" (written by evaluations that kept per-position ranks), the
  position-averaged formula from "cond_acc" otherwise (the training loop's own evaluation keeps no
  ranks, so `train_summary.json` gives that one; the row's `prediction_method` says which).

Trees: the engine's tree is dynamic (SGLang's num_steps/topk/num_draft_tokens, reranked per round
by draft scores). With the draft, the target and the held-out records in process
(`predict.heldout_trees.evaluate_predictor`: a `HeldoutTreePredictor`) it is decoded as the engine
decodes it, by the engine's own drafter over every held-out answer (`predict.text_replay`; method
DYNAMIC_TREE_METHOD). Otherwise (a bare `EvalResult`) it is approximated by the static tree
`tree_for_spec` builds the same way from the evaluation's position-averaged node probabilities:
depth-1 ranks 0..topk-1, each further depth the topk children of the best topk nodes, then the best
num_draft_tokens - 1 nodes overall, replayed (method "static_tree_replay"; 5-8% below the H200's
measured trees). A tree's position-averaged value is always the formula over that static tree.
Each row's `prediction_method` says which method gave its predicted tau.

error = measured - predicted (positive: the engine accepts more than predicted); relative error
= error / predicted. A large error for every setting points at a serving/training mismatch (the
field reports' 74.7% accuracy served at tau 1.12); an error growing with depth points at the
approximation (ground-truth vs accepted tokens, static vs dynamic tree).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError, DataFormatError, EaglewireError

log = logging.getLogger(__name__)

Node = tuple[int, ...]  # a path of draft ranks from the root, e.g. (0, 1)
# `prediction_method` of a tree decoded by the engine's drafter over the held-out answers
DYNAMIC_TREE_METHOD = "dynamic_tree_replay"


class TauPredictor(Protocol):
    """What `eaglewire.predict.evaluation.EvalResult` offers (SummaryPredictor offers chains only).

    `tau_chain` / `tau_tree` are the default prediction (`prediction_method`: "replay", or
    "position_averaged" where no per-position data exists); `position_averaged_*` the older formula."""

    @property
    def prediction_method(self) -> str: ...

    def tau_chain(self, k: int) -> float: ...

    def tau_tree(self, tree: Sequence[Sequence[int]]) -> float: ...

    def position_averaged_tau_chain(self, k: int) -> float: ...

    def position_averaged_tau_tree(self, tree: Sequence[Sequence[int]]) -> float: ...


@runtime_checkable
class DynamicTreePredictor(Protocol):
    """A predictor that decodes an engine setting's dynamic tree itself (`predict.heldout_trees`)."""

    def tau_dynamic_tree(self, spec: SpecArgs) -> float: ...


def static_tree_method(predictor: TauPredictor) -> str:
    """`prediction_method` of a tree approximated by `tree_for_spec`'s static tree."""
    return f"static_tree_{predictor.prediction_method}"


@dataclass(frozen=True)
class SummaryPredictor:
    """A predictor from an evaluation summary (chains only): the replayed `predicted_tau_chain`
    (k = 1..len) when the summary has it, the position-averaged formula from `cond_acc` otherwise."""

    cond_acc: tuple[float, ...]
    source: str = ""
    replay_tau_chain: tuple[float, ...] = ()  # summary["predicted_tau_chain"]: replay tau for k = 1..len

    @property
    def prediction_method(self) -> str:
        return "replay" if self.replay_tau_chain else "position_averaged"

    def tau_chain(self, k: int) -> float:
        # A draft trained on fewer unrolled steps than the bench drafts (the gpu preset trains 4, the
        # chain drafts 5) has a train_summary.json too shallow for it: say how to get a deep one.
        depth = len(self.replay_tau_chain or self.cond_acc)
        if not 0 <= k <= depth:
            raise ConfigError(
                f"chain length k={k}: {self.source or 'the evaluation summary'} evaluated {depth} draft steps",
                fix=f"pass --eval-data with held-out data (evaluated as deep as the bench drafts) or --eval-report "
                f"with the JSON of `eaglewire eval --num-steps {k} --json`",
            )
        if not self.replay_tau_chain:
            return self.position_averaged_tau_chain(k)
        return 1.0 if k == 0 else self.replay_tau_chain[k - 1]

    def position_averaged_tau_chain(self, k: int) -> float:
        from eaglewire.predict.replay import predicted_tau_chain

        return predicted_tau_chain(list(self.cond_acc), k)

    def tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        raise ConfigError(
            f"{self.source or 'the evaluation summary'} has per-step accuracies only; a tree prediction needs "
            "the per-position ranks of an in-process evaluation (eaglewire.predict.evaluation.EvalResult)"
        )

    def position_averaged_tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        return self.tau_tree(tree)


def _floats(values: list[Any]) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def _find_eval(obj: Any) -> dict[str, Any] | None:
    """The (nested) dict holding a "cond_acc" list: the report itself, or its eval/summary/metrics."""
    if isinstance(obj, dict):
        if isinstance(obj.get("cond_acc"), list):
            return obj
        for key in ("eval", "summary", "metrics"):
            found = _find_eval(obj.get(key))
            if found is not None:
                return found
    return None


def load_summary_predictor(path: Path) -> SummaryPredictor:
    """An evaluation report JSON (eval summary, or train_summary.json with an "eval" object)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"evaluation report {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    found = _find_eval(data)
    cond = _floats(found["cond_acc"]) if found is not None else []
    if not cond:
        raise DataFormatError(
            f"{path}: no 'cond_acc' list (per-step conditional accuracy) at the top level or under 'eval'",
            fix="pass the JSON `eaglewire eval` writes, or the training run's train_summary.json",
        )
    replay = found.get("predicted_tau_chain") if found is not None else None
    replay_tau = tuple(_floats(replay)) if isinstance(replay, list) else ()
    return SummaryPredictor(tuple(cond), str(path), replay_tau)


def find_summary_predictor(draft_dir: Path) -> SummaryPredictor | None:
    """train_summary.json beside a trained draft (`<run>/draft` -> `<run>/train_summary.json`), if any."""
    for candidate in (Path(draft_dir) / "train_summary.json", Path(draft_dir).parent / "train_summary.json"):
        if candidate.is_file():
            try:
                return load_summary_predictor(candidate)
            except DataFormatError:
                continue
    return None


def _node_probability(predictor: TauPredictor, node: Node) -> float:
    """Position-averaged P(node accepted) = tau(all prefixes of node) - tau(all prefixes of its parent)
    (the marginal over positions, which the draft's own scores rank by; replay has no per-node form)."""
    with_node = [node[: i + 1] for i in range(len(node))]
    tau = predictor.position_averaged_tau_tree
    return tau(with_node) - (tau(with_node[:-1]) if len(node) > 1 else 1.0)


def tree_for_spec(predictor: TauPredictor, spec: SpecArgs) -> list[Node]:
    """The static tree approximating the dynamic tree of `spec` (see the module docstring)."""
    probs: dict[Node, float] = {}
    frontier: list[Node] = [()]
    for _depth in range(spec.num_steps):
        children = [(*parent, r) for parent in frontier for r in range(spec.topk)]
        for c in children:
            probs[c] = _node_probability(predictor, c)
        frontier = sorted(children, key=lambda c: -probs[c])[: spec.topk]
    # Best num_draft_tokens - 1 nodes; ties go to the shallower (parents first), keeping the tree closed.
    ranked = sorted(probs, key=lambda c: (-probs[c], len(c), c))
    chosen: list[Node] = []
    for c in ranked:
        if len(chosen) == spec.num_draft_tokens - 1:
            break
        if len(c) == 1 or c[:-1] in chosen:
            chosen.append(c)
    return sorted(chosen, key=lambda c: (len(c), c))


@dataclass(frozen=True)
class SettingPrediction:
    """One engine setting's predicted tau, its position-averaged value and the method of the first."""

    tau: float
    position_averaged_tau: float
    method: str  # the predictor's for a chain; DYNAMIC_TREE_METHOD or `static_tree_method` for a tree


def predict_setting(predictor: TauPredictor, spec: SpecArgs) -> SettingPrediction:
    """`spec`'s prediction: a chain for topk=1; for a tree the engine's dynamic tree where the
    predictor decodes it (`DynamicTreePredictor`), else the static tree approximating it. The
    position-averaged value of a tree is the formula over the static tree either way."""
    if spec.is_chain:
        k = spec.num_steps
        return SettingPrediction(float(predictor.tau_chain(k)), float(predictor.position_averaged_tau_chain(k)),
                                 predictor.prediction_method)  # fmt: skip
    tree = tree_for_spec(predictor, spec)
    averaged = float(predictor.position_averaged_tau_tree(tree))
    if isinstance(predictor, DynamicTreePredictor):
        return SettingPrediction(float(predictor.tau_dynamic_tree(spec)), averaged, DYNAMIC_TREE_METHOD)
    return SettingPrediction(float(predictor.tau_tree(tree)), averaged, static_tree_method(predictor))


def predict_tau(predictor: TauPredictor, spec: SpecArgs) -> float:
    """Predicted tau for `spec` (see `predict_setting` and the module docstring)."""
    return predict_setting(predictor, spec).tau


@dataclass(frozen=True)
class PredictionRow:
    setting: dict[str, int]
    predicted_tau: float | None
    measured_tau: float | None
    note: str = ""  # why a prediction is missing
    position_averaged_tau: float | None = None  # the older formula, for comparison
    prediction_method: str = ""  # what predicted_tau is: `SettingPrediction.method`

    @property
    def error(self) -> float | None:
        if self.predicted_tau is None or self.measured_tau is None:
            return None
        return self.measured_tau - self.predicted_tau

    @property
    def relative_error(self) -> float | None:
        e = self.error
        return None if e is None or not self.predicted_tau else e / self.predicted_tau

    def to_json(self) -> dict[str, Any]:
        return {**self.setting, "predicted_tau": self.predicted_tau, "measured_tau": self.measured_tau,
                "error": self.error, "relative_error": self.relative_error, "note": self.note,
                "position_averaged_tau": self.position_averaged_tau,
                "prediction_method": self.prediction_method}  # fmt: skip


NO_EVALUATION = (
    "no offline evaluation given (none passed, no train_summary.json beside the draft); fix: pass --eval-data "
    "with held-out data or --eval-report with the JSON of `eaglewire eval --json`"
)


def prediction_rows(
    predictor: TauPredictor | None, measured: Sequence[tuple[SpecArgs, float | None]]
) -> list[PredictionRow]:
    """One row per measured setting; a setting the predictor cannot handle gets a note instead."""
    rows = []
    for spec, tau in measured:
        setting = {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens}
        if predictor is None:
            rows.append(PredictionRow(setting, None, tau, NO_EVALUATION))
            continue
        try:
            p = predict_setting(predictor, spec)
        except (EaglewireError, RuntimeError) as e:  # torch's errors (OOM, CUDA) are RuntimeErrors
            # A prediction is a check beside the measurement: its failure must not lose the bench.
            if not isinstance(e, ConfigError):
                log.warning("%s: held-out prediction failed: %s: %s", setting, type(e).__name__, e)
            note = str(e).splitlines()[0] if str(e) else type(e).__name__
            fix = e.fix if isinstance(e, EaglewireError) else None
            rows.append(PredictionRow(setting, None, tau, f"{note}; fix: {fix}" if fix else note))
            continue
        rows.append(PredictionRow(setting, p.tau, tau, "", p.position_averaged_tau, p.method))
    return rows


def prediction_summary(rows: Sequence[PredictionRow]) -> dict[str, Any]:
    """Mean / max absolute error, mean error (bias) and mean relative error over rows with both numbers."""
    errors = [r.error for r in rows if r.error is not None]
    rel = [r.relative_error for r in rows if r.relative_error is not None]
    if not errors:
        return {"settings_compared": 0}
    return {
        "settings_compared": len(errors),
        "mean_error": sum(errors) / len(errors),
        "mean_abs_error": sum(abs(e) for e in errors) / len(errors),
        "max_abs_error": max(abs(e) for e in errors),
        "mean_abs_relative_error": sum(abs(r) for r in rel) / len(rel) if rel else math.nan,
    }


def prediction_markdown(rows: Sequence[PredictionRow]) -> str:
    lines = [
        "| num_steps | topk | num_draft_tokens | predicted tau | measured tau | error | relative "
        "| position-averaged tau | method |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r.setting

        def f(x: float | None, spec: str = ".2f") -> str:
            return "-" if x is None else format(x, spec)

        rel = "-" if r.relative_error is None else f"{100 * r.relative_error:+.1f}%"
        pred = f(r.predicted_tau) if r.predicted_tau is not None else f"- ({r.note})"
        lines.append(
            f"| {s['num_steps']} | {s['topk']} | {s['num_draft_tokens']} | {pred} | {f(r.measured_tau)} | "
            f"{f(r.error, '+.2f')} | {rel} | {f(r.position_averaged_tau)} | {r.prediction_method or '-'} |"
        )
    methods = sorted({r.prediction_method for r in rows if r.prediction_method})
    if methods:
        lines += ["", f"method: how predicted tau was computed ({', '.join(methods)}; see eaglewire.predict.predictor); "
                  "a tree's position-averaged tau is the formula over the static tree"]  # fmt: skip
    return "\n".join(lines)
