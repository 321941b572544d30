"""Draft vs data: step-0 accuracy with the trained wiring and with each wiring an engine would feed.

The field reports' `test_drafter_standalone`, built in: the draft runs on data records once with
the aux columns it was trained on (the stored ones) and once per serving reading with the
columns that engine would assemble (recaptured at the engine's boundaries on the live target,
or, without a target, the stored columns permuted when the engine's boundaries are among them).
A large gap is a finding showing both numbers.

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
) -> CheckResult:
    """Step-0 accuracy on `records` as stored (the trained wiring, boundaries `data_boundaries` when known)
    and for each distinct served wiring; a drop of `gap_threshold` or more is a finding.

    labels: "target" (default with a target: training's metric) or "tokens" (default without).
    """
    result = CheckResult(name=CHECK)
    labels = labels or ("target" if target is not None else "tokens")
    if labels == "target" and target is None:
        raise ConfigError("standalone accuracy with labels='target' needs a live target", fix="pass --target")
    sample = list(records[:max_records])
    if not sample:
        result.skipped = True
        result.notes.append("no records")
        return result
    trained = tuple(data_boundaries) if data_boundaries is not None else None
    wirings: dict[tuple[int, ...], list[ServedReading]] = {}
    for r in served:
        if r.boundaries is not None and tuple(r.boundaries) != trained:
            wirings.setdefault(tuple(r.boundaries), []).append(r)
    runnable = {}
    for bounds, readers in wirings.items():
        if (
            target is not None
            and max(bounds) <= target.num_layers
            or trained is not None
            and set(bounds) <= set(trained)
        ):
            runnable[bounds] = readers
        else:
            result.notes.append(
                f"{', '.join(r.label for r in readers)} wiring {fmt_list(bounds)}: needs a --target to recapture; not measured"
            )
    union = list(dict.fromkeys(b for bounds in runnable for b in bounds))
    declared = Accuracy(0, 0)
    per_wiring = {bounds: Accuracy(0, 0) for bounds in runnable}
    for rec in sample:
        n = min(int(rec.input_ids.shape[0]), int(rec.aux.shape[0]), max_tokens)
        ids, mask = rec.input_ids[:n], rec.loss_mask[:n]
        recaptured, target_labels = _target_pass(target, ids, union, draft, want_labels=labels == "target")
        row_labels = (
            target_labels if labels == "target" and target_labels is not None else labels_from_tokens(ids)
        )
        declared = _sum(declared, step0_hits(draft, ids, mask, rec.aux[:n], row_labels))
        for bounds in runnable:
            aux = _assemble(bounds, union, recaptured, rec.aux[:n], trained)
            per_wiring[bounds] = _sum(per_wiring[bounds], step0_hits(draft, ids, mask, aux, row_labels))
    label_src = "the target's argmax at t+1" if labels == "target" else "the data's next tokens"
    result.notes.append(f"step-0 accuracy on {len(sample)} record(s), loss-masked rows, labels = {label_src}")
    result.rows.append(
        Row(
            item="step-0 accuracy, trained wiring",
            declared=f"stored columns {fmt_list(trained) if trained else '(as stored)'}",
            actual=declared.text(),
            ok=True,
        )
    )
    for bounds, acc in per_wiring.items():
        readers = runnable[bounds]
        labels_txt = ", ".join(r.label for r in readers)
        gap = declared.value - acc.value
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
            result.findings.append(
                Finding(
                    check="standalone.accuracy_gap",
                    severity="error",
                    what=f"served as {labels_txt}, the draft loses {100 * gap:.1f} points of step-0 accuracy",
                    declared=f"trained wiring {fmt_list(trained) if trained else '(stored)'}: {declared.text()}",
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
