"""Predicted acceptance length: the formula on hand-made tables, and the evaluator end to end."""

from __future__ import annotations

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.errors import ConfigError
from eaglewire.train.evaluate import evaluate_draft, full_tree, predicted_tau_chain, predicted_tau_tree
from eaglewire.train.target_side import OfflineTarget, TargetHead


def test_chain_formula_on_a_hand_table():
    cond = [0.8, 0.5, 0.5]
    assert predicted_tau_chain(cond, 0) == 1.0
    assert predicted_tau_chain(cond, 1) == pytest.approx(1.8)
    assert predicted_tau_chain(cond, 3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert predicted_tau_chain([1.0, float("nan"), 1.0], 3) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="k=4"):
        predicted_tau_chain(cond, 4)


def test_tree_estimator_on_a_hand_table():
    # 4 positions, ranks of the target token at depth 1 and 2
    ranks = torch.tensor([[0, 0], [0, 1], [1, 0], [2, 0]], dtype=torch.int16)
    valid = torch.ones(4, 2, dtype=torch.bool)
    chain = [(0,), (0, 0)]
    assert predicted_tau_tree(ranks, valid, chain) == pytest.approx(1 + 0.5 + 0.25)
    assert predicted_tau_tree(ranks, valid, chain) == pytest.approx(predicted_tau_chain([0.5, 0.5], 2))
    # greedy tree walk per row accepts 2, 2, 2, 0 tokens -> tau = 1 + 6/4
    tree = [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    assert predicted_tau_tree(ranks, valid, tree) == pytest.approx(2.5)
    assert len(full_tree(2, 2)) == 6
    with pytest.raises(ConfigError, match="parent"):
        predicted_tau_tree(ranks, valid, [(0, 0)])
    with pytest.raises(ConfigError, match="depth 3"):
        predicted_tau_tree(ranks, valid, [(0,), (0, 0), (0, 0, 0)])


def test_evaluator_end_to_end(tiny_target, tiny_contract, eval_captured):
    d2t = torch.arange(0, tiny_target.vocab_size, 3)  # a partial draft vocab: some target tokens are OOV
    draft = init_draft(tiny_target, tiny_contract, draft_to_target=d2t, seed=0)
    head = TargetHead.from_target(tiny_target, tiny_contract.final)
    side = OfflineTarget(head, tiny_contract, d2t)
    res = evaluate_draft(draft, tiny_contract, side, eval_captured, num_steps=3, max_length=64)
    s = res.summary()
    assert s["records"] == len(eval_captured) and len(s["acc"]) == 3
    # OOV count = valid step-0 rows whose target argmax is not in the draft vocab, computed independently
    expected_oov = 0
    in_vocab = torch.zeros(tiny_target.vocab_size, dtype=torch.bool)
    in_vocab[d2t] = True
    for r in eval_captured:
        top = head(r.final).argmax(-1)  # [T]: the target's token at position p
        for t in range(len(r.input_ids) - 2):
            if r.loss_mask[t + 2]:
                expected_oov += int(not in_vocab[top[t + 1]])
    assert expected_oov > 0
    oov_step0 = int(res.counts.table[0, 2])
    assert oov_step0 == expected_oov
    # the rank table and the count table agree: chain estimate from cond_acc == tree estimate of the chain
    for k in (1, 2, 3):
        assert res.tau_chain(k) == pytest.approx(res.tau_tree([(0,) * d for d in range(1, k + 1)]))
    assert res.tau_tree(full_tree(2, 2)) >= res.tau_chain(2)
