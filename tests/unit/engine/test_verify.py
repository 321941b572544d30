"""Verification on hand-made trees and distributions: greedy paths, lossless sampling (many
draws, chi-square), top-p processing, and the stop rule (eos, max tokens, stop strings)."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.sampling import SamplingParams, probs_from_logits, top_p_filter
from eaglewire.engine.tree import tree_from_parents
from eaglewire.engine.verify import StopRule, verify, verify_greedy, verify_sampling
from eaglewire.errors import ConfigError
from tests.helpers.tiny import tiny_tokenizer
from tests.unit.engine.stats import chi_square, detectable

V = 8
ALPHA = 1e-3

#        0 (root)
#      / | \
#     1  2  3        tokens 2, 5, 0
#     |
#     4              token 7
TOKENS = torch.tensor([6, 2, 5, 0, 7])
PARENTS = torch.tensor([-1, 0, 0, 0, 1])


def one_hot_logits(argmax_per_node: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(argmax_per_node), V)
    for i, t in enumerate(argmax_per_node):
        logits[i, t] = 5.0
    return logits


def test_greedy_follows_the_matching_child_and_adds_the_bonus():
    tree = tree_from_parents(TOKENS, PARENTS)
    # root -> 2 (node 1), node 1 -> 7 (node 4), node 4 -> 3 (bonus)
    verdict = verify_greedy(tree, one_hot_logits([2, 7, 1, 1, 3]))
    assert verdict.path == [0, 1, 4]
    assert verdict.emitted == [2, 7, 3]
    # root -> 5 (node 2, the second child), node 2 has no children: bonus 4
    verdict = verify_greedy(tree, one_hot_logits([5, 7, 4, 1, 3]))
    assert verdict.path == [0, 2] and verdict.emitted == [5, 4]
    # root -> 1: no child matches, only the bonus
    verdict = verify_greedy(tree, one_hot_logits([1, 7, 4, 1, 3]))
    assert verdict.path == [0] and verdict.emitted == [1]
    assert verify(tree, one_hot_logits([1, 7, 4, 1, 3]), SamplingParams(), None).emitted == [1]


def target_distributions(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(len(TOKENS), V, generator=g) ** 3 + 0.01  # uneven, no zero
    return probs / probs.sum(-1, keepdim=True)


def test_tree_sampling_is_lossless_first_and_second_token():
    target_probs = target_distributions()
    tree = tree_from_parents(TOKENS, PARENTS)
    g = torch.Generator().manual_seed(1)
    n = 8000
    first = torch.zeros(V)
    second_after_node1 = torch.zeros(V)
    accepted = 0
    for _ in range(n):
        verdict = verify_sampling(tree, target_probs, g)
        first[verdict.emitted[0]] += 1
        accepted += verdict.num_accepted_drafts > 0
        if verdict.emitted[0] == int(TOKENS[1]):
            second_after_node1[verdict.emitted[1]] += 1
    assert 0.05 < accepted / n < 0.95  # both acceptance and rejection ran
    _, _, p = chi_square(first, target_probs[0])
    assert p > ALPHA, f"first token does not follow the target: p={p}"
    _, _, p = chi_square(second_after_node1, target_probs[1])
    assert p > ALPHA, f"token after an accepted node does not follow that node's target: p={p}"
    # power: always taking the first candidate would be caught with this many draws
    assert detectable(target_probs[0], torch.nn.functional.one_hot(TOKENS[1], V).float(), n, ALPHA)


def test_sampled_chain_is_lossless():
    target_probs = target_distributions(2)[:2]
    draft_q = target_distributions(3)[0]  # the draft's (different) distribution
    g = torch.Generator().manual_seed(4)
    n = 8000
    first = torch.zeros(V)
    accepted = 0
    for _ in range(n):
        x = int(torch.multinomial(draft_q, 1, generator=g))
        draft_probs = torch.stack([torch.zeros(V), draft_q])
        tree = tree_from_parents(torch.tensor([6, x]), torch.tensor([-1, 0]), draft_probs=draft_probs)
        verdict = verify_sampling(tree, target_probs, g)
        first[verdict.emitted[0]] += 1
        accepted += verdict.num_accepted_drafts
    assert 0.05 < accepted / n < 0.95
    _, _, p = chi_square(first, target_probs[0])
    assert p > ALPHA, f"p={p}"
    assert detectable(target_probs[0], draft_q, n, ALPHA)  # accepting every draft would be caught


def test_top_p_keeps_the_smallest_sufficient_prefix():
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    torch.testing.assert_close(top_p_filter(probs, 0.8), torch.tensor([0.0, 0.5, 0.0, 0.3]) / 0.8)
    torch.testing.assert_close(top_p_filter(probs, 0.81), torch.tensor([0.15, 0.5, 0.0, 0.3]) / 0.95)
    torch.testing.assert_close(top_p_filter(probs, 0.1), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    logits = torch.log(probs)
    torch.testing.assert_close(probs_from_logits(logits, SamplingParams(temperature=1.0)), probs)
    sharp = probs_from_logits(logits, SamplingParams(temperature=0.5))
    torch.testing.assert_close(sharp, probs**2 / (probs**2).sum())
    assert probs_from_logits(logits, SamplingParams()).tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5)])
def test_sampling_params_are_checked(bad):
    with pytest.raises(ConfigError):
        SamplingParams(**bad)


def test_stop_rule_eos_and_max_tokens_inside_a_block():
    rule = StopRule(max_new_tokens=10, eos_token_ids=frozenset({2}))
    assert rule.cut([1, 1], [5, 2, 7, 8]) == ([5, 2], "eos")
    assert rule.cut([1] * 8, [5, 6, 7]) == ([5, 6], "max_new_tokens")
    assert rule.cut([], [5, 6, 7]) == ([5, 6, 7], None)


def test_stop_rule_stop_strings_cut_text_and_tokens():
    tok = tiny_tokenizer()
    ids = tok("Hello! How are you today? I am fine", add_special_tokens=False)["input_ids"]
    decode = lambda t: tok.decode(t)  # noqa: E731
    rule = StopRule(max_new_tokens=100, stop_strings=("you",), decode=decode)
    kept, finish = rule.cut([], ids)
    assert finish == "stop_string"
    assert "you" in decode(kept) and "you" not in decode(kept[:-1])
    assert rule.final_text(decode(kept), finish) == "Hello! How are "
    # split across two verification rounds: same cut
    half = len(kept) - 1
    first, none = rule.cut([], ids[:half])
    assert none is None
    assert rule.cut(first, ids[half:]) == (kept[half:], "stop_string")
