"""Prediction check: the trainer's offline predicted acceptance length vs the tau the engine measures.

The prediction comes from `eaglewire.train.evaluate` (held-out data, no engine). The default is the
**replay** (module docstring there): greedy speculative decoding simulated over the held-out
responses from the evaluation's per-position draft ranks, tau = tokens emitted / verification
rounds. The older **position-averaged** formula (1 + the mean accepted drafts over *every* position)
is reported beside it (`position_averaged_tau`): rounds start right after a rejected draft and
draft errors cluster, so it overestimates the engine's tau (15-47% measured on an H200).

* an `EvalResult` (in process; `evaluate_predictor` runs the evaluation on a held-out dataset)
  replays chains and trees;
* a JSON summary (`eaglewire eval --json`, or any report with "cond_acc"): chains only, the replay
  when it carries "predicted_tau_chain" (written by evaluations that kept per-position ranks), the
  position-averaged formula from "cond_acc" otherwise (the training loop's own evaluation keeps no
  ranks, so `train_summary.json` gives that one; the row's `prediction_method` says which).

Trees: the engine's tree is dynamic (SGLang's num_steps/topk/num_draft_tokens, reranked per round
by draft scores); it is approximated by the static tree `tree_for_spec` builds the same way from
the evaluation's position-averaged node probabilities: depth-1 ranks 0..topk-1, each further depth
the topk children of the best topk nodes, then the best num_draft_tokens - 1 nodes overall. That
static tree is then replayed.

error = measured - predicted (positive: the engine accepts more than predicted); relative error
= error / predicted. A large error for every setting points at a serving/training mismatch (the
field reports' 74.7% accuracy served at tau 1.12); an error growing with depth points at the
approximation (ground-truth vs accepted tokens, static vs dynamic tree).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError, DataFormatError

Node = tuple[int, ...]  # a path of draft ranks from the root, e.g. (0, 1)


class TauPredictor(Protocol):
    """What `eaglewire.train.evaluate.EvalResult` offers (SummaryPredictor offers chains only).

    `tau_chain` / `tau_tree` are the default prediction (`prediction_method`: "replay", or
    "position_averaged" where no per-position data exists); `position_averaged_*` the older formula."""

    @property
    def prediction_method(self) -> str: ...

    def tau_chain(self, k: int) -> float: ...

    def tau_tree(self, tree: Sequence[Sequence[int]]) -> float: ...

    def position_averaged_tau_chain(self, k: int) -> float: ...

    def position_averaged_tau_tree(self, tree: Sequence[Sequence[int]]) -> float: ...


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
        if not self.replay_tau_chain:
            return self.position_averaged_tau_chain(k)
        if k == 0:
            return 1.0
        if not 0 < k <= len(self.replay_tau_chain):
            raise ConfigError(
                f"chain length k={k}: expected 0..{len(self.replay_tau_chain)} "
                f"({self.source or 'the evaluation summary'} replayed {len(self.replay_tau_chain)} steps)"
            )
        return self.replay_tau_chain[k - 1]

    def position_averaged_tau_chain(self, k: int) -> float:
        from eaglewire.train.replay import predicted_tau_chain

        return predicted_tau_chain(list(self.cond_acc), k)

    def tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        raise ConfigError(
            f"{self.source or 'the evaluation summary'} has per-step accuracies only; a tree prediction needs "
            "the per-position ranks of an in-process evaluation (eaglewire.train.evaluate.EvalResult)"
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


def evaluate_predictor(
    draft_dir: Path,
    target: str,
    data_dir: Path,
    *,
    num_steps: int,
    max_records: int = 0,
    device: str | None = None,
    target_dtype: str | None = None,
    horizon: int | None = None,
    answer: int | None = None,
) -> TauPredictor:
    """Run the trainer's offline evaluation (`eaglewire.train.run.run_eval`) on a held-out tokenized
    dataset or shard directory: an `EvalResult`, which predicts chains and trees. `horizon`: replay
    only the first that many tokens of each response (the benchmark's max_new_tokens); `answer`:
    only each record's answer-th response (1: first answers; None: all, `EvalResult.answer`)."""
    from dataclasses import replace

    from eaglewire.train.run import run_eval

    result = run_eval(
        draft_dir=Path(draft_dir),
        target=target,
        data_dir=Path(data_dir),
        num_steps=num_steps,
        max_records=max_records,
        device=device,
        target_dtype=target_dtype,
    )
    return replace(result, horizon=horizon, answer=answer)


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


def predict_taus(predictor: TauPredictor, spec: SpecArgs) -> tuple[float, float]:
    """(predicted tau, position-averaged tau) for `spec`: a chain for topk=1, the static tree
    approximating the dynamic one otherwise (the same tree for both)."""
    if spec.is_chain:
        k = spec.num_steps
        return float(predictor.tau_chain(k)), float(predictor.position_averaged_tau_chain(k))
    tree = tree_for_spec(predictor, spec)
    return float(predictor.tau_tree(tree)), float(predictor.position_averaged_tau_tree(tree))


def predict_tau(predictor: TauPredictor, spec: SpecArgs) -> float:
    """Predicted tau for `spec` (the default: replay; see the module docstring)."""
    return predict_taus(predictor, spec)[0]


@dataclass(frozen=True)
class PredictionRow:
    setting: dict[str, int]
    predicted_tau: float | None
    measured_tau: float | None
    note: str = ""  # why a prediction is missing
    position_averaged_tau: float | None = None  # the older formula, for comparison
    prediction_method: str = ""  # "replay" | "position_averaged": what predicted_tau is

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


def prediction_rows(
    predictor: TauPredictor | None, measured: Sequence[tuple[SpecArgs, float | None]]
) -> list[PredictionRow]:
    """One row per measured setting; a setting the predictor cannot handle gets a note instead."""
    rows = []
    for spec, tau in measured:
        setting = {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens}
        if predictor is None:
            rows.append(PredictionRow(setting, None, tau, "no offline evaluation given"))
            continue
        try:
            predicted, averaged = predict_taus(predictor, spec)
            rows.append(PredictionRow(setting, predicted, tau, "", averaged, predictor.prediction_method))
        except ConfigError as e:
            rows.append(PredictionRow(setting, None, tau, str(e).splitlines()[0]))
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
        "| position-averaged tau |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r.setting

        def f(x: float | None, spec: str = ".2f") -> str:
            return "-" if x is None else format(x, spec)

        rel = "-" if r.relative_error is None else f"{100 * r.relative_error:+.1f}%"
        pred = f(r.predicted_tau) if r.predicted_tau is not None else f"- ({r.note})"
        lines.append(
            f"| {s['num_steps']} | {s['topk']} | {s['num_draft_tokens']} | {pred} | {f(r.measured_tau)} | "
            f"{f(r.error, '+.2f')} | {rel} | {f(r.position_averaged_tau)} |"
        )
    methods = sorted({r.prediction_method for r in rows if r.prediction_method})
    if methods:
        lines += ["", f"predicted tau: {' / '.join(methods)} (see eaglewire.bench.prediction)"]
    return "\n".join(lines)
