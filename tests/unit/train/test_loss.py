"""Loss and accuracy bookkeeping on hand-made tensors."""

from __future__ import annotations

import math

import torch

from eaglewire.train.loss import (
    OUT_OF_VOCAB_RANK,
    RANK_CAP,
    StepCounts,
    restrict_target_logits,
    step_outcome,
    stored_rank,
    target_rank,
    target_to_draft,
)

D2T = torch.tensor([0, 2, 4])  # draft vocab: target ids 0, 2, 4 (V = 6)
T2D = target_to_draft(D2T, 6)


def hand_target():
    # rows' target argmax: 2 (draft 1), 3 (OOV), 4 (draft 2), 5 (OOV)
    logits = torch.full((1, 4, 6), -1.0)
    for t, tok in enumerate([2, 3, 4, 5]):
        logits[0, t, tok] = 3.0
    logits[0, :, 0] = torch.tensor([0.5, 1.0, -2.0, 2.0])
    return logits


def test_restriction_renormalises_over_the_draft_vocab():
    logits = hand_target()
    dist = restrict_target_logits(logits, D2T, T2D)
    assert T2D.tolist() == [0, -1, 1, -1, 2, -1]
    torch.testing.assert_close(dist.probs, torch.softmax(logits[..., [0, 2, 4]], -1))
    assert dist.in_vocab[0].tolist() == [True, False, True, False]
    assert dist.token[0].tolist() == [1, 0, 2, 0]


def test_out_of_vocab_rows_are_masked_from_the_loss_and_counted():
    dist = restrict_target_logits(hand_target(), D2T, T2D)
    draft_logits = torch.tensor(
        [[[0.0, 2.0, 1.0], [5.0, 0.0, 0.0], [0.0, 3.0, 1.0], [4.0, 0.0, 0.0]]], requires_grad=True
    )
    valid = torch.ones(1, 4, dtype=torch.bool)
    out = step_outcome(draft_logits, dist, valid, torch.ones_like(valid))
    counts = dict(
        zip(
            ("valid", "counted", "oov", "correct", "chain_prev", "chain_correct", "loss"),
            out.counts.tolist(),
            strict=True,
        )
    )
    assert counts["valid"] == 4 and counts["counted"] == 2 and counts["oov"] == 2
    # OOV rows: the draft's argmax 0 equals the clamped token 0 but is not right; row 2 is wrong (argmax 1 != 2)
    assert out.correct[0].tolist() == [True, False, False, False]
    assert counts["correct"] == 1
    logq = torch.log_softmax(draft_logits.detach(), -1)
    expected = -(dist.probs[0, [0, 2]] * logq[0, [0, 2]]).sum()
    torch.testing.assert_close(out.loss_sum, expected)
    out.loss_sum.backward()
    assert draft_logits.grad is not None
    assert torch.all(draft_logits.grad[0, [1, 3]] == 0)  # masked rows get no gradient
    # the soft cross-entropy's gradient: softmax(draft logits) - target distribution
    expected_grad = torch.softmax(draft_logits.detach()[0, [0, 2]], -1) - dist.probs[0, [0, 2]]
    torch.testing.assert_close(draft_logits.grad[0, [0, 2]], expected_grad)
    # KL is the same minus the target entropy
    kl = step_outcome(draft_logits.detach(), dist, valid, torch.ones_like(valid), kind="kl")
    entropy = -(dist.probs[0, [0, 2]] * dist.probs[0, [0, 2]].log()).sum()
    torch.testing.assert_close(kl.loss_sum, expected - entropy)


def test_rank_and_conditional_accuracy():
    dist = restrict_target_logits(hand_target(), D2T, T2D)
    draft_logits = torch.tensor([[[0.0, 2.0, 1.0], [5.0, 0.0, 0.0], [0.0, 3.0, 1.0], [4.0, 0.0, 0.0]]])
    assert target_rank(draft_logits, dist)[0].tolist() == [0, 3, 1, 3]
    # as the evaluation stores them: the out-of-vocab rows get a marker no in-vocab rank can reach
    assert stored_rank(draft_logits, dist)[0].tolist() == [0, OUT_OF_VOCAB_RANK, 1, OUT_OF_VOCAB_RANK]
    assert RANK_CAP < OUT_OF_VOCAB_RANK <= torch.iinfo(torch.int16).max
    # two steps: step 0 right at rows {0, 1}, step 1 right at rows {1, 2}
    counts = StepCounts(2)
    valid = torch.ones(1, 3, dtype=torch.bool)
    right = [torch.tensor([[True, True, False]]), torch.tensor([[False, True, True]])]
    chain = torch.ones_like(valid)
    for s in range(2):
        token = torch.zeros(1, 3, dtype=torch.long)
        logits = torch.where(right[s][..., None], torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
        from eaglewire.train.loss import TargetDistribution

        tgt = TargetDistribution(torch.tensor([1.0, 0.0]).expand(1, 3, 2), token, torch.ones_like(valid))
        out = step_outcome(logits, tgt, valid, chain)
        counts.add(s, out.counts)
        chain = chain & out.correct
    summary = counts.summary([1.0, 0.8])
    assert summary["acc"] == [2 / 3, 2 / 3]
    assert summary["cond_acc"] == [2 / 3, 0.5]
    assert summary["valid_rows"] == [3, 3]
    assert math.isfinite(summary["loss"])


def test_hard_label_weight_mixes_the_label_with_a_one_hot_on_the_target_argmax():
    dist = restrict_target_logits(hand_target(), D2T, T2D)
    draft_logits = torch.tensor([[[0.0, 2.0, 1.0], [5.0, 0.0, 0.0], [0.0, 3.0, 1.0], [4.0, 0.0, 0.0]]])
    valid = torch.ones(1, 4, dtype=torch.bool)
    chain = torch.ones_like(valid)
    logq = torch.log_softmax(draft_logits, -1)[0, [0, 2]]  # the two in-vocab rows
    soft = -(dist.probs[0, [0, 2]] * logq).sum()
    hard = torch.nn.functional.cross_entropy(
        draft_logits[0, [0, 2]], dist.token[0, [0, 2]], reduction="sum"
    )  # against draft tokens 1 and 2
    for w in (0.0, 0.3, 1.0):
        out = step_outcome(draft_logits, dist, valid, chain, hard_label_weight=w)
        torch.testing.assert_close(out.loss_sum, (1 - w) * soft + w * hard)
    # kl subtracts the mixed label's entropy: a draft that puts exactly that label scores 0
    label = 0.4 * dist.probs[0, [0, 2]] + 0.6 * torch.nn.functional.one_hot(dist.token[0, [0, 2]], 3)
    exact = torch.zeros(1, 4, 3)
    exact[0, [0, 2]] = label.log()
    out = step_outcome(exact, dist, valid, chain, kind="kl", hard_label_weight=0.6)
    torch.testing.assert_close(out.loss_sum, torch.tensor(0.0), atol=1e-6, rtol=0)


def test_hard_label_weight_outside_0_to_1_is_refused_naming_the_field():
    import pytest

    from eaglewire.errors import ConfigError
    from eaglewire.train.config import TrainConfig

    with pytest.raises(ConfigError, match="hard_label_weight.*1.5"):
        TrainConfig(hard_label_weight=1.5)
