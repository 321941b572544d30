"""Served vs predicted (`doctor.served`, steps 3-4): the rows, and when served falls short, every candidate
miswiring replayed and the one that explains it named with its fix."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from eaglewire.contract.numbering import describe_boundary
from eaglewire.doctor.findings import CheckResult, Finding, Row, fmt_list
from eaglewire.doctor.miswirings import Candidate, ServedSetup, Wiring, all_candidates
from eaglewire.doctor.served_client import RoundCounts
from eaglewire.doctor.served_replay import Prediction, ReplayWorld, ServedText, in_text_tau
from eaglewire.engine.spec_args import SpecArgs

if TYPE_CHECKING:
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

CHECK = "served acceptance"
REL_TOL = 0.03  # the prediction's stated error off float32 CPU (the bench measured 0.5-2%)
ABS_TOL = 0.05
UNINFORMATIVE = 0.2  # below this first-position acceptance (as trained) wirings are hard to tell apart


def tolerance(predicted_tau: float) -> float:
    """How far served may be from predicted and still match (`doctor.served` docstring, step 3)."""
    return max(REL_TOL * predicted_tau, ABS_TOL)


@dataclass
class ServedCheck(CheckResult):
    """The served check's result, with its numbers for `--json` (`served`)."""

    served: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "served": self.served}


@dataclass(frozen=True)
class Match:
    candidates: list[Candidate]  # every explanation that gives this wiring
    prediction: Prediction
    exact: bool  # every prompt's verifications equal the served ones
    distance: float  # `_distance`: per-prompt verifications, tau and per-position acceptance


def _per_position(counts: RoundCounts, depth: int) -> list[float]:
    return counts.per_position_acceptance(depth) or []


def _distance(
    served_tau: float, served: RoundCounts, served_rounds: Sequence[int], predicted: Prediction, depth: int
) -> float:
    """How far a replay is from what was served: the prompts' verification counts (relative L1: two wirings of
    a similar pooled tau still differ prompt by prompt), tau, and the mean per-position difference."""
    s, p = _per_position(served, depth), predicted.counts.per_position_acceptance(depth) or []
    per_pos = sum(abs(a - b) for a, b in zip(s, p, strict=False)) / depth if s and p else 0.0
    rounds = sum(abs(a - b) for a, b in zip(served_rounds, predicted.rounds, strict=True)) / max(
        sum(served_rounds), 1
    )
    return rounds + abs(served_tau - predicted.tau) + per_pos


def _acc(values: Sequence[float] | None) -> str:
    return "-" if not values else " ".join(f"{v:.2f}" for v in values)


def compare_served(
    result: ServedCheck,
    texts: Sequence[ServedText],
    *,
    target: LoadedTarget,
    draft: Eagle3Draft,
    trained: Sequence[int],
    trained_from: str,
    spec: SpecArgs,
    setup: ServedSetup,
    engine: str,
    prefill_token: bool,
    engine_own: str = "",
    observed: SpecArgs | None = None,
    world: ReplayWorld | None = None,
) -> ServedCheck:
    """Served vs predicted on `texts` (each with the engine's counts): the rows, and when short the candidates'
    replays and the finding naming the match (`doctor.served` docstring, steps 2-4). No HTTP: `check_served`
    collects the texts; tests may pass texts an engine decoded in-process, and a `world` built on the same texts
    (and wirings) to reuse its replays."""
    served = RoundCounts.pooled(t.counts for t in texts)
    L = target.num_layers
    d2t = draft.get_buffer("draft_to_target")
    identity = bool(torch.equal(d2t.cpu(), torch.arange(d2t.shape[0])))
    candidates = all_candidates(setup, identity_map=identity)
    declared = Wiring.of(trained)
    replayable = [c for c in candidates if c.wiring is not None]
    if world is None:
        wirings = [declared, *(c.wiring for c in replayable if c.wiring)]
        world = ReplayWorld(target, draft, texts, prefill_token, wirings)
    predicted = world.predict(declared, spec)
    depth = spec.num_steps
    tau_p = predicted.tau
    tau_s = in_text_tau(predicted.emitted, served.verifications)
    tol = tolerance(tau_p)
    exact = [t.counts.verifications for t in texts] == predicted.rounds
    s_pos, p_pos = _per_position(served, depth), predicted.counts.per_position_acceptance(depth)
    result.rows += [
        Row(
            "tau (tokens of the text / verifications)",
            f"predicted {tau_p:.3f} +- {tol:.3f}",
            f"served {tau_s:.3f}" + (f" (the engine's own: {engine_own})" if engine_own else ""),
            abs(tau_s - tau_p) <= tol,
            note="exact: every prompt's verifications equal" if exact else "",
        ),
        Row(
            f"acceptance per position 1..{depth}",
            f"predicted {_acc(p_pos)}",
            f"served {_acc(s_pos)}",
            not s_pos
            or not p_pos
            or max(abs(a - b) for a, b in zip(s_pos, p_pos, strict=False)) <= max(tol, 0.05),
        ),
    ]
    result.notes.append(
        f"predicted for the draft's wiring: aux boundaries {fmt_list(trained)} ({trained_from}), "
        f"num_steps {spec.num_steps} topk {spec.topk} num_draft_tokens {spec.num_draft_tokens}; "
        f"{served.verifications} served verifications, {predicted.counts.verifications} replayed"
    )
    if p_pos and p_pos[0] < UNINFORMATIVE:
        result.notes.append(
            f"even wired as trained, this draft's first draft token is accepted in only {100 * p_pos[0]:.0f}% of the "
            "rounds on these prompts: every wiring serves about as badly, so a match says little; send prompts "
            "like the draft's training data (--prompts)"
        )
    if (
        observed is not None
        and spec.num_draft_tokens != observed.num_draft_tokens
        and not any(c.fault == "spec.draft_length" for c in candidates)
    ):
        result.notes.append(
            f"the server verifies {observed.num_draft_tokens - 1} drafted tokens per round, the launch arguments "
            f"given say {spec.num_draft_tokens - 1}: are they what the server runs?"
        )
    result.served |= {
        "spec": {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens},
        "served": {**served.to_json(), "tau_in_text": tau_s, "per_position_acceptance": s_pos},
        "predicted": {**predicted.counts.to_json(), "tau_in_text": tau_p, "per_position_acceptance": p_pos},
        "tolerance": tol,
        "exact": exact,
        "served_verifications_per_prompt": [t.counts.verifications for t in texts],
        "predicted_verifications_per_prompt": predicted.rounds,
        "verdict": "match",
        "candidates": [],
    }
    if abs(tau_s - tau_p) <= tol:
        return result
    if tau_s > tau_p:
        result.served["verdict"] = "above"
        result.findings.append(
            Finding(
                check="served.above_prediction",
                severity="error",
                what=f"served acceptance {tau_s:.3f} is above the {tau_p:.3f} this draft can reach on the served text "
                f"(+- {tol:.3f}): the server does not serve this draft with this target on greedy text",
                declared=f"--draft and --target as given; predicted {tau_p:.3f}",
                actual=f"served {tau_s:.3f} ({engine})",
                fix="pass the draft and target the server was launched with (--draft, --target), and check that it "
                "decodes greedily at temperature 0",
            )
        )
        return result
    matches, impossible = _replay_candidates(world, candidates, spec, served, tau_s, texts)
    result.served["candidates"] = [
        {
            "faults": [c.fault for c in m.candidates],
            "what": [c.what for c in m.candidates],
            "predicted_tau": m.prediction.tau,
            "predicted_per_position_acceptance": m.prediction.counts.per_position_acceptance(
                (m.candidates[0].wiring.spec or spec).num_steps if m.candidates[0].wiring else depth
            ),
            "exact": m.exact,
            "within_error": abs(tau_s - m.prediction.tau) <= tolerance(m.prediction.tau),
            "fix": m.candidates[0].fix,
        }
        for m in matches
    ] + [{"faults": [c.fault], "what": [c.what], "impossible": c.impossible} for c in impossible]
    result.notes += [f"not replayed: {c.what}: {c.impossible}" for c in impossible]
    within = [m for m in matches if m.exact or abs(tau_s - m.prediction.tau) <= tolerance(m.prediction.tau)]
    short = (
        f"served acceptance {tau_s:.3f} is short of the {tau_p:.3f} this draft reaches on the served text under its "
        f"wiring (+- {tol:.3f})"
    )
    if not within:
        result.served["verdict"] = "short, unexplained"
        closest = sorted(matches, key=lambda m: m.distance)[:5]
        result.findings.append(
            Finding(
                check="served.short_unexplained",
                severity="error",
                what=f"{short}, and no candidate miswiring explains it",
                declared=f"predicted {tau_p:.3f}, per position {_acc(p_pos)}",
                actual=f"served {tau_s:.3f}, per position {_acc(s_pos)}",
                fix="check that the server runs this draft and target (the same files, --draft and --target here) "
                "and the draft length assumed above (a tree: pass the server's launch flags with --sglang-args), "
                "and check the export itself: eaglewire doctor --draft EXPORT --target TARGET",
                details=tuple(
                    f"{m.candidates[0].fault}: {m.candidates[0].what}: predicted {m.prediction.tau:.3f}"
                    for m in closest
                ),
            )
        )
        return result
    best = within[0]
    result.served["verdict"] = best.candidates[0].fault
    others = within[1:]
    c = best.candidates[0]
    also = [
        f"the served config gives exactly this: {x.what}"
        if x.fault == "aux.config_reading"
        else f"the same wiring: {x.what}"
        for x in best.candidates[1:]
    ]
    also += [
        f"also within the error: {m.candidates[0].what} (predicted {m.prediction.tau:.3f}"
        + (", round for round" if m.exact else "")
        + ")"
        for m in others
    ]
    if best.prediction.counts.accepted == 0:
        also.append(
            "under this wiring no drafted token is ever accepted: a server whose draft has nothing to do with this "
            "one (another draft, another target) looks the same; check that first"
        )
    m_pos = best.prediction.counts.per_position_acceptance(
        (c.wiring.spec or spec).num_steps if c.wiring else depth
    )
    result.findings.append(
        Finding(
            check=f"served.{c.fault}",
            severity="error",
            what=f"{short}; it matches {c.what}",
            declared=f"trained on aux boundaries {', '.join(f'{b} ({describe_boundary(b, L)})' for b in trained)}; "
            f"predicted {tau_p:.3f}, per position {_acc(p_pos)}",
            actual=f"served {tau_s:.3f}, per position {_acc(s_pos)}; this miswiring predicts "
            f"{best.prediction.tau:.3f}, per position {_acc(m_pos)}"
            + (" (every prompt's verifications equal: exact)" if best.exact else ""),
            fix=c.fix,
            details=tuple(also),
        )
    )
    return result


def _replay_candidates(
    world: ReplayWorld,
    candidates: Sequence[Candidate],
    spec: SpecArgs,
    served: RoundCounts,
    served_tau: float,
    texts: Sequence[ServedText],
) -> tuple[list[Match], list[Candidate]]:
    """Replay each distinct candidate wiring once; matches ordered exact first, then by distance."""
    groups: dict[Wiring, list[Candidate]] = {}
    impossible: list[Candidate] = []
    for c in candidates:
        if c.wiring is None:
            impossible.append(c)
        else:
            groups.setdefault(c.wiring, []).append(c)
    served_rounds = [t.counts.verifications for t in texts]
    matches = []
    for wiring, group in groups.items():
        group.sort(
            key=lambda c: c.fault == "aux.config_reading"
        )  # the fault class first, the config's reading after
        run_spec = wiring.spec or spec
        prediction = world.predict(replace(wiring, spec=None), run_spec)
        matches.append(
            Match(
                group,
                prediction,
                prediction.rounds == served_rounds,
                _distance(served_tau, served, served_rounds, prediction, run_spec.num_steps),
            )
        )
        log.info("candidate %s: predicted tau %.3f", group[0].fault, prediction.tau)
    matches.sort(key=lambda m: (not m.exact, m.distance))
    return matches, impossible
