"""Draft vs data: step-0 accuracy with the trained wiring and with each wiring an engine would feed.

The field reports' `test_drafter_standalone`, built in: the draft runs on data records once with
the aux columns it was trained on (the stored ones) and once per serving reading with the
columns that engine would assemble (recaptured at the engine's boundaries on the live target,
or, without a target, the stored columns permuted when the engine's boundaries are among them).
A large gap is a finding showing both numbers.

When the data's columns are not the draft contract's boundaries (mislabelled data), the draft is
also measured with its contract's boundaries recaptured on the target (`learned_wiring`): the
wiring it scores clearly better on is the one it learned (`WiringVerdict`), and the served
wirings are then measured against that one.

The metric is training's step 0 (`eaglewire.train.ttt`: row t reads fc(h_t) and x[t+1] at
position t and predicts x[t+2]; it counts where `loss_mask[t+2]`), reused from there so the two
cannot drift. A hit is the draft's argmax, mapped to target ids, equal to the label:
`labels="target"` (training's accuracy, `eaglewire.train.loss`; needs a live target): the
target's argmax at position t+1; `labels="tokens"`: the data's next token x[t+2], as the field
reports' test did (on self-distilled data it is the target's greedy choice). Both wirings are always measured
with the same labels, so the gap is meaningful either way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from eaglewire.contract.contract import FinalState
from eaglewire.data.types import CapturedRecord
from eaglewire.doctor.findings import CheckResult, Finding, Row, fmt_list
from eaglewire.doctor.serving_common import ServedReading
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import ConfigError
from eaglewire.target.capture import capture
from eaglewire.target.loading import LoadedTarget
from eaglewire.train.ttt import shift_left, step_valid, ttt_unroll

log = logging.getLogger(__name__)

CHECK = "draft vs data"
GAP_THRESHOLD = 0.05  # absolute step-0 accuracy points that count as "a large gap"
STEP0 = 0
LABEL_OFFSET = 1  # the target's prediction at position t+1 is row t's step-0 label (see train.ttt)
TOKEN_OFFSET = 2  # row t's step-0 label token is x[t+2] (see train.ttt)
LabelSource = Literal["tokens", "target"]


@dataclass(frozen=True)
class Accuracy:
    correct: int
    total: int

    @property
    def value(self) -> float:
        return self.correct / self.total if self.total else float("nan")

    def text(self) -> str:
        return (
            f"{100 * self.value:.1f}% ({self.correct}/{self.total})"
            if self.total
            else "n/a (no loss-masked rows)"
        )


@torch.no_grad()
def step0_hits(
    draft: Eagle3Draft,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux: torch.Tensor,
    labels: torch.Tensor,
) -> Accuracy:
    """input_ids, loss_mask [T], aux [T, A*Ht], labels [T] target ids per row (row t: label of x[t+2])."""
    param = next(draft.parameters())
    ids = input_ids[None].to(param.device)  # [1, T]
    T = ids.shape[1]
    doc = torch.zeros_like(ids)
    positions = torch.arange(T, device=param.device)[None]
    out = next(iter(ttt_unroll(draft, ids, positions, doc, aux[None].to(param.device, param.dtype), 1)))
    pred = draft.to_target_ids(out.logits.argmax(-1))[0]  # [T] target ids
    valid = step_valid(doc, loss_mask[None].to(param.device).bool(), STEP0)[0]  # [T]
    hits = (pred == labels.to(param.device)) & valid
    return Accuracy(int(hits.sum()), int(valid.sum()))


def labels_from_tokens(input_ids: torch.Tensor) -> torch.Tensor:
    """[T] -> [T]: row t's label is x[t+2] (-1 past the end)."""
    return shift_left(input_ids[None], TOKEN_OFFSET, fill=-1)[0]


def labels_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """logits [T, V] -> [T]: row t's label is the target's argmax at t+1 over the full vocabulary.

    As training counts accuracy (`eaglewire.train.loss.step_outcome`): a target argmax outside the
    draft vocabulary can never be matched, so it counts as a miss.
    """
    return shift_left(logits.argmax(-1)[None], LABEL_OFFSET, fill=-1)[0]


def _sum(a: Accuracy, b: Accuracy) -> Accuracy:
    return Accuracy(a.correct + b.correct, a.total + b.total)


@dataclass(frozen=True)
class WiringVerdict:
    """Which wiring a draft learned, told by its own step-0 accuracy under both: the data's stored columns
    (their real boundaries, by values) and its contract's boundaries recaptured on the live target.

    This is what tells "this data is mislabelled" (the draft reads its contract's boundaries: the draft is
    fine) from "this draft was trained on mislabelled data" (it reads the data's real boundaries: its
    contract is wrong). Labels and fingerprints cannot: both drafts have a contract that matches the target.
    """

    stored: tuple[int, ...]  # the data's columns, by values
    contract: tuple[int, ...]  # the draft's contract
    stored_acc: Accuracy
    contract_acc: Accuracy
    labels: LabelSource
    gap_threshold: float = GAP_THRESHOLD

    @property
    def learned(self) -> Literal["contract", "data", "unclear"]:
        """'contract' / 'data' when one wiring wins by gap_threshold or more, else 'unclear'."""
        if self.contract_acc.total == 0 or self.stored_acc.total == 0:
            return "unclear"
        gap = self.contract_acc.value - self.stored_acc.value
        if gap >= self.gap_threshold:
            return "contract"
        if -gap >= self.gap_threshold:
            return "data"
        return "unclear"

    def evidence(self) -> str:
        return (
            f"step-0 accuracy {self.contract_acc.text()} with its contract's boundaries {fmt_list(self.contract)} "
            f"(recaptured on the target) against {self.stored_acc.text()} on the data's columns "
            f"{fmt_list(self.stored)} (labels = {LABEL_TEXT[self.labels]})"
        )


LABEL_TEXT: dict[str, str] = {"target": "the target's argmax at t+1", "tokens": "the data's next tokens"}


def measure(
    draft: Eagle3Draft,
    sample: Sequence[CapturedRecord],
    *,
    wirings: Sequence[tuple[int, ...]],
    stored: Sequence[int] | None,
    target: LoadedTarget | None,
    labels: LabelSource,
    max_tokens: int,
) -> tuple[Accuracy, dict[tuple[int, ...], Accuracy]]:
    """Step-0 accuracy on the stored columns, and with each of `wirings` (recaptured on `target`, or without
    one the stored columns permuted: every wiring must then be among `stored`)."""
    union = list(dict.fromkeys(b for bounds in wirings for b in bounds))
    declared = Accuracy(0, 0)
    per_wiring = {bounds: Accuracy(0, 0) for bounds in wirings}
    for rec in sample:
        n = min(int(rec.input_ids.shape[0]), int(rec.aux.shape[0]), max_tokens)
        ids, mask = rec.input_ids[:n], rec.loss_mask[:n]
        recaptured, target_labels = _target_pass(target, ids, union, draft, want_labels=labels == "target")
        row_labels = (
            target_labels if labels == "target" and target_labels is not None else labels_from_tokens(ids)
        )
        declared = _sum(declared, step0_hits(draft, ids, mask, rec.aux[:n], row_labels))
        for bounds in wirings:
            aux = _assemble(bounds, union, recaptured, rec.aux[:n], stored)
            per_wiring[bounds] = _sum(per_wiring[bounds], step0_hits(draft, ids, mask, aux, row_labels))
    return declared, per_wiring


def learned_wiring(
    draft: Eagle3Draft,
    records: Sequence[CapturedRecord],
    *,
    stored: Sequence[int],
    contract: Sequence[int],
    target: LoadedTarget,
    labels: LabelSource | None = None,
    max_records: int = 8,
    max_tokens: int = 256,
    gap_threshold: float = GAP_THRESHOLD,
) -> WiringVerdict:
    """The draft's step-0 accuracy on the stored columns (boundaries `stored`, by values) and with its
    contract's boundaries recaptured on `target`: which of the two it learned (see `WiringVerdict`)."""
    labels = labels or "target"
    stored, contract = tuple(stored), tuple(contract)
    stored_acc, per = measure(
        draft,
        list(records[:max_records]),
        wirings=[contract],
        stored=stored,
        target=target,
        labels=labels,
        max_tokens=max_tokens,
    )
    return WiringVerdict(stored, contract, stored_acc, per[contract], labels, gap_threshold)


def check_standalone(
    draft: Eagle3Draft,
    records: Sequence[CapturedRecord],
    *,
    data_boundaries: Sequence[int] | None,
    served: Sequence[ServedReading] = (),
    target: LoadedTarget | None = None,
    max_records: int = 8,
    max_tokens: int = 256,
    gap_threshold: float = GAP_THRESHOLD,
    labels: LabelSource | None = None,
    verdict: WiringVerdict | None = None,
) -> CheckResult:
    """Step-0 accuracy on `records` as stored (boundaries `data_boundaries` when known) and for each
    distinct served wiring; a drop of `gap_threshold` or more from the trained wiring is a finding.

    The trained wiring is the stored columns, unless `verdict` (from `learned_wiring`) showed that the
    draft reads its contract's boundaries instead: then served wirings are measured against those.
    labels: "target" (default with a target: training's metric) or "tokens" (default without).
    """
    result = CheckResult(name=CHECK)
    labels = labels or (verdict.labels if verdict else None) or ("target" if target is not None else "tokens")
    if labels == "target" and target is None:
        raise ConfigError("standalone accuracy with labels='target' needs a live target", fix="pass --target")
    sample = list(records[:max_records])
    if not sample:
        result.skipped = True
        result.notes.append("no records")
        return result
    stored = tuple(data_boundaries) if data_boundaries is not None else None
    known: dict[tuple[int, ...], Accuracy] = {}
    if verdict is not None:
        known = {verdict.contract: verdict.contract_acc}
    reference = verdict.contract if verdict is not None and verdict.learned == "contract" else stored
    wirings: dict[tuple[int, ...], list[ServedReading]] = {}
    for r in served:
        if r.boundaries is not None and tuple(r.boundaries) != reference:
            wirings.setdefault(tuple(r.boundaries), []).append(r)
    runnable = {}
    for bounds, readers in wirings.items():
        if (
            bounds in known
            or bounds == stored
            or target is not None
            and max(bounds) <= target.num_layers
            or stored is not None
            and set(bounds) <= set(stored)
        ):
            runnable[bounds] = readers
        else:
            result.notes.append(
                f"{', '.join(r.label for r in readers)} wiring {fmt_list(bounds)}: needs a --target to recapture; not measured"
            )
    to_measure = [b for b in runnable if b not in known and b != stored]
    measured: dict[tuple[int, ...], Accuracy]
    if verdict is not None and not to_measure:
        stored_acc, measured = verdict.stored_acc, {}
    else:
        stored_acc, measured = measure(
            draft,
            sample,
            wirings=to_measure,
            stored=stored,
            target=target,
            labels=labels,
            max_tokens=max_tokens,
        )
    per_wiring = {**known, **measured}
    if stored is not None:
        per_wiring[stored] = stored_acc
    result.notes.append(
        f"step-0 accuracy on {len(sample)} record(s), loss-masked rows, labels = {LABEL_TEXT[labels]}"
    )
    if verdict is not None and reference == verdict.contract:
        ref_acc = verdict.contract_acc
        ref_text = f"contract's boundaries {fmt_list(reference)} (recaptured)"
        result.rows.append(
            Row(item="step-0 accuracy, trained wiring", declared=ref_text, actual=ref_acc.text(), ok=True)
        )
        result.rows.append(
            Row(
                item="step-0 accuracy, the data's columns",
                declared=f"stored columns {fmt_list(stored)}",
                actual=stored_acc.text(),
                ok=True,
                note="the data's labels are not what its columns hold; the draft does not read these",
            )
        )
    else:
        ref_acc = stored_acc
        result.rows.append(
            Row(
                item="step-0 accuracy, trained wiring",
                declared=f"stored columns {fmt_list(stored) if stored else '(as stored)'}",
                actual=stored_acc.text(),
                ok=True,
            )
        )
        if verdict is not None:
            result.rows.append(
                Row(
                    item="step-0 accuracy, the draft's contract wiring",
                    declared=f"contract's boundaries {fmt_list(verdict.contract)} (recaptured)",
                    actual=verdict.contract_acc.text(),
                    ok=True,
                    note="the draft does not read what its contract says"
                    if verdict.learned == "data"
                    else "no clear winner: which wiring the draft learned is not known",
                )
            )
    for bounds, readers in runnable.items():
        acc = per_wiring[bounds]
        labels_txt = ", ".join(r.label for r in readers)
        gap = ref_acc.value - acc.value
        ok = not gap >= gap_threshold
        result.rows.append(
            Row(
                item=f"step-0 accuracy, {labels_txt}",
                declared=f"wiring {fmt_list(bounds)}",
                actual=acc.text(),
                ok=ok,
            )
        )
        if not ok:
            trained_txt = fmt_list(reference) if reference else "(stored)"
            result.findings.append(
                Finding(
                    check="standalone.accuracy_gap",
                    severity="error",
                    what=f"served as {labels_txt}, the draft loses {100 * gap:.1f} points of step-0 accuracy",
                    declared=f"trained wiring {trained_txt}: {ref_acc.text()}",
                    actual=f"served wiring {fmt_list(bounds)}: {acc.text()}",
                    fix=readers[0].fix,
                )
            )
    return result


def _target_pass(
    target: LoadedTarget | None,
    ids: torch.Tensor,
    boundaries: Sequence[int],
    draft: Eagle3Draft,
    *,
    want_labels: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One target forward: aux at `boundaries` [T, len*Ht] (None when not asked) and target labels [T] (when asked)."""
    if target is None or not (boundaries or want_labels):
        return None, None
    L = target.num_layers
    states = capture(
        target.model,
        ids[None].to(target.device),
        aux_boundaries=list(boundaries) or [L],
        final=FinalState(L, "pre"),
        return_logits=want_labels,
    )
    labels = None
    if states.logits is not None:
        labels = labels_from_logits(states.logits[0].float())
    return (states.aux[0] if boundaries else None), labels


def _assemble(
    bounds: Sequence[int],
    union: Sequence[int],
    recaptured: torch.Tensor | None,
    stored: torch.Tensor,
    trained: Sequence[int] | None,
) -> torch.Tensor:
    """The [T, A*Ht] aux an engine with `bounds` would feed: slices of the recapture, else of the stored columns."""
    if recaptured is not None:
        ht = recaptured.shape[-1] // len(union)
        cols = [recaptured[:, union.index(b) * ht : (union.index(b) + 1) * ht] for b in bounds]
    else:
        assert trained is not None
        ht = stored.shape[-1] // len(trained)
        cols = [stored[:, list(trained).index(b) * ht : (list(trained).index(b) + 1) * ht] for b in bounds]
    return torch.cat(cols, dim=-1)  # [T, A*Ht]
