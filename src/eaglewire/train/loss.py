"""Per-step loss and accuracy of the training-time test, against the target's own distribution.

The label of a row is the target's next-token distribution `target_probs`, restricted to the
draft vocabulary and renormalised. A row whose target argmax token is *outside* the draft
vocabulary cannot be drafted at all: it is masked out of the loss and counted (`oov_masked`),
and it counts as wrong in every accuracy (the engine could never accept a token there).

Accuracy compares the draft's argmax with the target's argmax (greedy acceptance):
`acc[s]` over all valid rows of step s; `cond_acc[s]` over the valid rows whose steps 0..s-1 were
all right (the chance that draft token s+1 is accepted given the chain got that far).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from eaglewire.train.ttt import shift_left

# Columns of the per-step count table (all sums over rows; float64 so they all-reduce exactly).
COUNT_FIELDS = ("valid", "counted", "oov_masked", "correct", "chain_prev", "chain_correct", "loss_sum")
NUM_COUNTS = len(COUNT_FIELDS)
_COL = {name: i for i, name in enumerate(COUNT_FIELDS)}


def target_to_draft(draft_to_target: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[Vd] absolute target ids -> [V] draft id of each target token, -1 where it has none."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_to_target.device)
    t2d[draft_to_target] = torch.arange(len(draft_to_target), device=draft_to_target.device)
    return t2d


@dataclass
class TargetDistribution:
    """The target's next-token distribution at each position, in draft-vocab coordinates.

    `shifted(k)` aligns row t with position t+k without copying `probs` (the [B, T, Vd] tensor is
    the largest one in a step): it shifts `token`/`in_vocab` and records the offset, and
    `probs_of_rows(rows)` gathers the shifted rows on demand.
    """

    probs: torch.Tensor  # [..., Vd] float32, restricted to the draft vocab and renormalised
    token: torch.Tensor  # [...] int64 draft id of the target's argmax (0 where it is out of vocab)
    in_vocab: torch.Tensor  # [...] bool: the target's argmax token is in the draft vocab
    offset: int = 0  # row t of token/in_vocab describes probs[:, t + offset]

    def shifted(self, k: int) -> TargetDistribution:
        """Along T (dim 1 of [B, T, ...]): row t gets position t+k (beyond the end: out of vocab)."""
        return TargetDistribution(
            self.probs, shift_left(self.token, k), shift_left(self.in_vocab, k, False), self.offset + k
        )

    def probs_of_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [N] flat indices b*T + t (rows whose position t + offset is inside the row, e.g. the
        valid rows of a step) -> [N, Vd], without a device sync."""
        B, T, Vd = self.probs.shape
        return self.probs.reshape(B * T, Vd)[rows + self.offset]


def restrict_target_logits(
    target_logits: torch.Tensor, draft_to_target: torch.Tensor, t2d: torch.Tensor
) -> TargetDistribution:
    """target_logits [..., V] -> TargetDistribution [..., Vd]; argmax taken over the full vocab V."""
    argmax = target_logits.argmax(-1)  # [...]
    draft_id = t2d[argmax]
    restricted = target_logits.index_select(-1, draft_to_target)  # [..., Vd]
    return TargetDistribution(
        probs=torch.softmax(restricted, dim=-1, dtype=torch.float32),
        token=draft_id.clamp_min(0),
        in_vocab=draft_id >= 0,
    )


@dataclass
class StepOutcome:
    loss_sum: torch.Tensor  # scalar with grad: summed per-row loss over the counted rows
    counts: torch.Tensor  # [NUM_COUNTS] float64, detached (see COUNT_FIELDS)
    correct: torch.Tensor  # [B, T] bool: draft argmax == target argmax (in vocab), where scored


def step_outcome(
    draft_logits: torch.Tensor,
    target: TargetDistribution,
    valid: torch.Tensor,
    chain_ok: torch.Tensor,
    *,
    kind: Literal["soft_ce", "kl"] = "soft_ce",
    hard_label_weight: float = 0.0,
    rows: torch.Tensor | None = None,
    scored: torch.Tensor | None = None,
    trained: torch.Tensor | None = None,
) -> StepOutcome:
    """draft_logits [B, T, Vd], or [M, Vd]: the logits of the flat rows `scored` [M] only (ascending
    indices b*T + t including every valid row, `StepRows.scored`); `target` already aligned with the
    rows (shifted by 1+step); valid [B, T] rows trained at this step; chain_ok [B, T] all earlier
    steps right; rows [N] int64: the flat indices of the valid rows (`StepRows.index`: gathering by
    index costs no device->host sync, a boolean mask does); derived from `valid` when None.

    The loss is taken over the valid rows whose target argmax is in the draft vocabulary; the
    others (out of vocabulary) contribute exactly 0 to the sum and to the gradient.
    `hard_label_weight` w mixes the label: (1 - w) * the target's distribution + w * a one-hot on
    its argmax token (see `TrainConfig.hard_label_weight`). `correct` is
    computed where there are logits (False elsewhere). trained [B, T] bool: the valid rows whose loss
    counts (`TrainConfig.align_topk`; the others add 0 to the sum and the gradient); None = all."""
    B, T = valid.shape
    if rows is None:
        rows = valid.reshape(-1).nonzero().squeeze(1)
    if scored is None:
        flat = draft_logits.reshape(B * T, -1)  # [B*T, Vd]
        at = rows
    else:
        flat = draft_logits  # [M, Vd]
        at = torch.searchsorted(scored, rows)  # [N] where each valid row is among the scored ones
    z = flat[at].float()  # [N, Vd] draft logits of the valid rows
    probs = target.probs_of_rows(rows)  # [N, Vd]
    draftable = target.in_vocab.reshape(-1)[rows]  # [N]
    # -sum(p * log_softmax(z)) = logsumexp(z) - p.z, since p sums to 1: no [N, Vd] log-probabilities
    # or products are materialised, and the gradient is softmax(z) - p (elementwise kernels outweighed
    # the matrix products in an H200 profile of a step; these are the largest tensors a step touches)
    label = probs  # [N, Vd]
    label_dot_z = torch.linalg.vecdot(probs, z)  # [N]
    if hard_label_weight:
        token = target.token.reshape(-1)[rows][:, None]  # [N, 1] draft id of the target's argmax
        label_dot_z = (1.0 - hard_label_weight) * label_dot_z + hard_label_weight * z.gather(
            1, token
        ).squeeze(1)
        if kind == "kl":  # the mixed label itself is only needed for its entropy
            label = ((1.0 - hard_label_weight) * probs).scatter_add(
                1, token, torch.full_like(probs[:, :1], hard_label_weight)
            )
    per_row = torch.logsumexp(z, dim=-1) - label_dot_z  # [N]
    if kind == "kl":  # minus the label's entropy, so a perfect match scores 0
        per_row = per_row + torch.special.xlogy(label, label).sum(-1)
    if trained is not None:
        draftable = draftable & trained.reshape(-1)[rows]
    loss_sum = torch.where(draftable, per_row, torch.zeros_like(per_row)).sum()
    with torch.no_grad():
        if scored is None:
            correct = (draft_logits.argmax(-1) == target.token) & target.in_vocab
        else:
            hit = (flat.argmax(-1) == target.token.reshape(-1)[scored]) & target.in_vocab.reshape(-1)[scored]
            correct = torch.zeros(B * T, dtype=torch.bool, device=valid.device)
            correct[scored] = hit
            correct = correct.view(B, T)
        counted = valid & target.in_vocab
        counts = torch.stack(
            [
                valid.sum(),
                counted.sum(),
                (valid & ~target.in_vocab).sum(),
                (valid & correct).sum(),
                (valid & chain_ok).sum(),
                (valid & chain_ok & correct).sum(),
            ]
        ).to(torch.float64)
        counts = torch.cat([counts, loss_sum.detach().to(torch.float64).reshape(1)])
    return StepOutcome(loss_sum=loss_sum, counts=counts, correct=correct)


def in_top_k(
    draft_logits: torch.Tensor,
    target: TargetDistribution,
    k: int,
    scored: torch.Tensor | None,
    shape: torch.Size,
) -> torch.Tensor:
    """bool `shape` [B, T]: the target's argmax token is among the draft's top k (ties count for it;
    never where it is out of vocab). draft_logits [B, T, Vd], or [M, Vd] of the flat rows `scored`
    [M] (False at the other rows), as in `step_outcome`."""
    with torch.no_grad():
        # an in-vocab rank is at most Vd - 1; out of vocab it is Vd, never a hit whatever k is
        hit = target_rank(draft_logits, target, scored) < min(k, draft_logits.shape[-1])
        if scored is None:
            return hit.view(shape)
        out = torch.zeros(shape.numel(), dtype=torch.bool, device=draft_logits.device)
        out[scored] = hit
        return out.view(shape)


# Ranks as the evaluation keeps them (int16): in-vocab ranks capped at RANK_CAP, and a marker of its own for
# a label outside the draft vocabulary (Vd itself would be ambiguous once ranks are capped).
RANK_CAP = 32766
OUT_OF_VOCAB_RANK = RANK_CAP + 1


def stored_rank(draft_logits: torch.Tensor, target: TargetDistribution) -> torch.Tensor:
    """[B, T] int64 `target_rank` of every row as the evaluation stores it: capped at RANK_CAP,
    OUT_OF_VOCAB_RANK where the target token is outside the draft vocabulary."""
    rank = target_rank(draft_logits, target).clamp_max(RANK_CAP)
    return torch.where(target.in_vocab, rank, torch.full_like(rank, OUT_OF_VOCAB_RANK))


def target_rank(
    draft_logits: torch.Tensor, target: TargetDistribution, scored: torch.Tensor | None = None
) -> torch.Tensor:
    """[B, T] int64: how many draft tokens score strictly higher than the target's argmax token
    (0 = the draft's top-1 is right); Vd where the target token is out of the draft vocab.
    With `scored` [M] (flat rows b*T + t) and draft_logits [M, Vd] of those rows only: [M]."""
    token, in_vocab = target.token, target.in_vocab
    if scored is not None:
        token, in_vocab = token.reshape(-1)[scored], in_vocab.reshape(-1)[scored]  # [M]
    at_target = draft_logits.gather(-1, token[..., None])  # [..., 1]
    rank = (draft_logits > at_target).sum(-1)
    return torch.where(in_vocab, rank, torch.full_like(rank, draft_logits.shape[-1]))


class StepCounts:
    """Running [S, NUM_COUNTS] table; sums are exact across micro-batches and processes."""

    def __init__(self, num_steps: int, device: torch.device | str = "cpu") -> None:
        self.table = torch.zeros(num_steps, NUM_COUNTS, dtype=torch.float64, device=device)

    def add(self, step: int, counts: torch.Tensor) -> None:
        self.table[step] += counts.to(self.table.device)

    def column(self, name: str) -> list[float]:
        return [float(v) for v in self.table[:, _COL[name]]]

    def summary(self, step_weights: list[float]) -> dict[str, object]:
        """Metrics dict: loss (weighted sum of per-step mean losses), per-step lists, OOV count."""

        def ratio(num: str, den: str) -> list[float]:
            return [
                float(n / d) if d > 0 else float("nan")
                for n, d in zip(self.column(num), self.column(den), strict=True)
            ]

        loss_per_step = ratio("loss_sum", "valid")
        loss = sum(w * v for w, v in zip(step_weights, loss_per_step, strict=True) if v == v)
        return {
            "loss": float(loss),
            "loss_per_step": loss_per_step,
            "acc": ratio("correct", "valid"),
            "cond_acc": ratio("chain_correct", "chain_prev"),
            "valid_rows": [int(v) for v in self.column("valid")],
            "oov_masked": int(sum(self.column("oov_masked"))),
        }
