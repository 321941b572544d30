"""Predicted acceptance length: the formula on hand-made tables, and the evaluator end to end."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.errors import ConfigError
from eaglewire.predict.evaluation import EvalResult, evaluate_draft
from eaglewire.predict.replay import (
    accepted_drafts,
    chain_tree,
    full_tree,
    predicted_tau_chain,
    predicted_tau_tree,
    replay_accepted,
    replay_tree,
    response_spans,
    response_turns,
)
from eaglewire.train.loss import OUT_OF_VOCAB_RANK, StepCounts
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


def _region(n: int, steps: int) -> torch.Tensor:
    """valid [n, steps] of one response that fills a record: row t, step s valid while t + s < n."""
    t = torch.arange(n)[:, None]
    s = torch.arange(steps)[None, :]
    return t + s < n


def test_replay_chain_on_clustered_errors():
    # One response of 13 rows, chain of 2. Row 0's step 0 predicts the response's first token, which
    # the engine's first round drafts (its root is the prompt's last token). Rows 0-4 are a hard
    # stretch (both drafts wrong), rows 5-12 an easy one (both right; row 12's second draft is past the end).
    ranks = torch.tensor([[1, 1]] * 5 + [[0, 0]] * 8, dtype=torch.int16)
    valid = _region(13, 2)
    assert accepted_drafts(ranks, valid, chain_tree(2)).tolist() == [0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 1]
    r = replay_tree(ranks, valid, [13], chain_tree(2))
    # rounds at t = 0, 1, 2, 3, 4 (1 token each), 5, 8, 11 (3 tokens each): 14 tokens / 8 rounds
    assert (r.rounds, r.tokens) == (8, 14)
    assert r.tau == pytest.approx(14 / 8)
    assert r.per_position_acceptance == pytest.approx([3 / 8, 3 / 8])
    # the position average sees 8 easy rows of 13: 1 + 8/13 + 8/13 * 7/7, far above the replay
    assert predicted_tau_tree(ranks, valid, chain_tree(2)) == pytest.approx(29 / 13)
    assert predicted_tau_chain([8 / 13, 1.0], 2) == pytest.approx(29 / 13)
    # chain of 1: every row is a round start of its own unless the previous round accepted
    r1 = replay_tree(ranks, valid, [13], chain_tree(1))
    # t = 0,1,2,3,4 (0), 5 (1) -> 7 (1) -> 9 (1) -> 11 (1) -> 13: 9 rounds, 5 + 8 tokens
    assert (r1.rounds, r1.tokens, r1.per_position_acceptance) == (9, 13, [4 / 9])


def test_without_vocab_misses_accepts_the_out_of_vocab_labels():
    # The clustered response above with its hard stretch's first drafts out of the draft vocabulary:
    # drafted right, rows 0-4 accept their first draft (their second stays wrong).
    ranks = torch.tensor([[OUT_OF_VOCAB_RANK, 1]] * 5 + [[0, 0]] * 8, dtype=torch.int16)
    res = EvalResult(StepCounts(2), [1.0, 1.0], ranks, _region(13, 2), records=1, tokens=13, segments=(13,))
    assert res.out_of_vocab_share() == pytest.approx([5 / 13, 0.0])
    assert res.tau_chain(2) == pytest.approx(14 / 8)  # as in test_replay_chain_on_clustered_errors
    full = res.without_vocab_misses()
    # rounds at t = 0 (2 tokens), 2, 4 (2 each), 6, 9 (3 each), 12 (2: its second draft is past the end)
    assert (full.replay_chain(2).rounds, full.replay_chain(2).tokens) == (6, 14)
    assert full.ranks[:, 0].tolist() == [0] * 13 and full.ranks[:, 1].tolist() == ranks[:, 1].tolist()


def test_replay_horizon_stops_rounds_like_max_new_tokens():
    # The clustered response above: a decoder with max_new_tokens = 5 emits 5 one-token rounds
    # (t = 0..4), so it never reaches the easy stretch that starts at row 5.
    ranks = torch.tensor([[1, 1]] * 5 + [[0, 0]] * 8, dtype=torch.int16)
    valid = _region(13, 2)
    short = replay_tree(ranks, valid, [13], chain_tree(2), horizon=5)
    assert (short.rounds, short.tokens, short.tau) == (5, 5, 1.0)
    # a horizon past the response's end changes nothing
    whole = replay_tree(ranks, valid, [13], chain_tree(2))
    assert replay_tree(ranks, valid, [13], chain_tree(2), horizon=100) == whole
    # a round that starts inside the horizon counts whole (a decoder cuts its tokens; tau is per round)
    assert replay_tree(ranks, valid, [13], chain_tree(2), horizon=6).tokens == 5 + 3
    with pytest.raises(ConfigError, match="horizon"):
        replay_tree(ranks, valid, [13], chain_tree(2), horizon=0)


def test_replay_walks_each_response_of_each_record():
    # Two record slices back to back: 5 rows (row 0 prompt) and 8 rows (two responses: rows 0-2, 5-7).
    valid0 = torch.tensor([0, 1, 1, 1, 1] + [1, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
    spans = response_spans(valid0, [5, 8])
    assert spans == [(1, 5), (5, 8), (10, 13)]
    # 9 marks rows no round starts at (never read)
    accepted = torch.tensor([9, 2, 9, 9, 0] + [1, 9, 0, 9, 9, 0, 0, 0])
    r = replay_accepted(accepted, spans, depth=2)
    # slice 1: t=1 (2) -> 4 (0) -> 5: end. slice 2: t=5 (1) -> 7 (0) -> 8: end; t=10, 11, 12 (0) -> 13: end
    assert (r.rounds, r.tokens) == (7, 3 + 1 + 2 + 1 + 1 + 1 + 1)
    assert r.per_position_acceptance == pytest.approx([2 / 7, 1 / 7])
    # a response of one row is one round (its first token); an empty evaluation has none
    assert replay_accepted(torch.tensor([0]), response_spans(torch.tensor([True]), [1]), 1).rounds == 1
    empty = replay_tree(
        torch.zeros(0, 2, dtype=torch.int16), torch.zeros(0, 2, dtype=torch.bool), [], chain_tree(2)
    )
    assert (empty.tau, empty.rounds) == (1.0, 0)
    with pytest.raises(ValueError, match="segments"):
        response_spans(valid0, [5, 7])


def test_replay_by_turn_splits_each_records_answers():
    # Slices of 5 rows (one answer: rows 1-4) and 8 rows (answers at rows 0-2 and 5-7), as above.
    valid0 = torch.tensor([0, 1, 1, 1, 1] + [1, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
    spans = response_spans(valid0, [5, 8])
    assert response_turns(spans, [5, 8]) == [1, 1, 2]
    assert response_turns(response_spans(valid0, [13]), [13]) == [1, 2]  # one slice: rows 1-7 are one answer
    # step-0 ranks: 0 = right; turn 1's answers (rows 1-4, 5-7) all right, turn 2's (10-12) all wrong
    ranks = torch.tensor([[5], [0], [0], [0], [0], [0], [0], [0], [5], [5], [1], [1], [1]], dtype=torch.int16)
    valid = valid0[:, None]
    counts = StepCounts(1)
    res = EvalResult(counts, [1.0], ranks, valid, records=2, tokens=13, segments=(5, 8))
    by_turn = res.replay_chain_by_turn(1)
    # turn 1: rounds at rows 1, 3 and 5, 7 accept their draft -> 4 rounds of 2 tokens; turn 2: rows 10,
    # 11, 12 accept none -> 3 rounds of 1 token
    assert {t: (r.rounds, r.tokens) for t, r in by_turn.items()} == {1: (4, 8), 2: (3, 3)}
    whole = res.replay_chain(1)
    assert whole.rounds == sum(r.rounds for r in by_turn.values())
    assert whole.tokens == sum(r.tokens for r in by_turn.values())
    with pytest.raises(ConfigError, match="chain length"):
        res.replay_chain_by_turn(2)
    # a result cut to one answer replays exactly that answer's responses, in chains and trees
    for turn, want in by_turn.items():
        only = replace(res, answer=turn)
        assert (only.replay_chain(1).rounds, only.replay_chain(1).tokens) == (want.rounds, want.tokens)
        assert only.tau_chain(1) == want.tau
    assert replace(res, answer=3).replay_chain(1).rounds == 0  # no record has a third answer


def test_replay_tree_follows_the_true_rank_path():
    tree = [(0,), (1,), (0, 0), (1, 0)]
    # row 0: [5,5] -> 0; 1: [1,0] -> 2 via (1,),(1,0); 4: [0,1] -> 1; 6: [2,0] -> 0; 7: [0,0] -> 2
    ranks = torch.tensor([[5, 5], [1, 0], [5, 5], [5, 5], [0, 1], [5, 5], [2, 0], [0, 0], [0, 0], [0, 0]])
    valid = _region(10, 2)
    assert accepted_drafts(ranks, valid, tree).tolist() == [0, 2, 0, 0, 1, 0, 0, 2, 2, 1]
    r = replay_tree(ranks, valid, [10], tree)
    # t = 0 (0) -> 1 (2) -> 4 (1) -> 6 (0) -> 7 (2) -> 10: 5 rounds, 1 + 3 + 2 + 1 + 3 tokens
    assert (r.rounds, r.tokens, r.tau) == (5, 10, 2.0)
    assert r.per_position_acceptance == pytest.approx([3 / 5, 2 / 5])
    # position-averaged over all rows: P((0,)) = 4/10, P((1,)) = 1/10, P((0, 0)) = 4/10 * 2/3 (row 9 has
    # no depth 2), P((1, 0)) = 1/10 * 1/1
    assert predicted_tau_tree(ranks, valid, tree) == pytest.approx(1 + 0.4 + 0.1 + 4 / 15 + 0.1)


def test_result_without_ranks_predicts_position_averaged_only():
    counts = StepCounts(2)
    counts.table[:, 0] = 10.0  # valid rows
    counts.table[:, 4] = torch.tensor([10.0, 5.0])  # chain_prev
    counts.table[:, 5] = torch.tensor([5.0, 5.0])  # chain_correct
    res = EvalResult(
        counts, [1.0, 0.8], torch.zeros(0, 2, dtype=torch.int16), torch.zeros(0, 2, dtype=torch.bool), 1, 12
    )
    assert not res.has_positions and "predicted_tau_chain" not in res.summary()
    assert res.position_averaged_tau_chain(2) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="per-position"):
        res.tau_chain(2)


def _naive_replay(ranks: torch.Tensor, valid: torch.Tensor, lengths: list[int], k: int) -> tuple[int, int]:
    """Replay written out per record from its step-0 rows (rows t = 0..len-3), as the module docstring says."""
    rounds = tokens = 0
    offset = 0
    for n in lengths:
        rows = n - 2
        rk, vk = ranks[offset : offset + rows], valid[offset : offset + rows]
        offset += rows
        t = 0
        while t < rows:
            if not vk[t, 0]:
                t += 1
                continue
            end = t
            while end < rows and vk[end, 0]:
                end += 1
            while t < end:
                acc = 0
                while acc < k and vk[t, acc] and rk[t, acc] == 0:
                    acc += 1
                rounds, tokens = rounds + 1, tokens + acc + 1
                t += acc + 1
            t = end
    return rounds, tokens


def test_evaluator_end_to_end(peaked_target, peaked_contract, eval_captured):
    d2t = torch.arange(0, peaked_target.vocab_size, 3)  # a partial draft vocab: some target tokens are OOV
    draft = init_draft(peaked_target, peaked_contract, draft_to_target=d2t, seed=0)
    head = TargetHead.from_target(peaked_target, peaked_contract.final)
    side = OfflineTarget(head, peaked_contract, d2t)
    draft.eval()
    res = evaluate_draft(draft, peaked_contract, side, eval_captured, num_steps=3, max_length=64)
    assert not draft.training  # evaluating leaves the caller's draft in the mode it came in
    s = res.summary()
    assert s["records"] == len(eval_captured) and len(s["acc"]) == 3
    # OOV count = valid step-0 rows whose target argmax is not in the draft vocab, computed independently
    expected_oov = 0
    in_vocab = torch.zeros(peaked_target.vocab_size, dtype=torch.bool)
    in_vocab[d2t] = True
    for r in eval_captured:
        top = head(r.final).argmax(-1)  # [T]: the target's token at position p
        for t in range(len(r.input_ids) - 2):
            if r.loss_mask[t + 2]:
                expected_oov += int(not in_vocab[top[t + 1]])
    assert expected_oov > 0
    oov_step0 = int(res.counts.table[0, 2])
    assert oov_step0 == expected_oov
    assert res.out_of_vocab_share()[0] == pytest.approx(expected_oov / int(res.valid[:, 0].sum()))
    # every out-of-vocab label drafted right: the replay can only gain, and gains here (OOV rows exist)
    full = res.without_vocab_misses()
    assert full.out_of_vocab_share() == [0.0, 0.0, 0.0] and full.ranks.dtype == res.ranks.dtype
    assert full.tau_chain(3) > res.tau_chain(3) and res.tau_chain(3) == res.replay_chain(3).tau  # own cache
    # the rank table and the count table agree: chain estimate from cond_acc == tree estimate of the chain
    for k in (1, 2, 3):
        assert res.position_averaged_tau_chain(k) == pytest.approx(
            res.position_averaged_tau_tree(chain_tree(k))
        )
        assert res.tau_chain(k) == pytest.approx(res.tau_tree(chain_tree(k)))
    assert res.position_averaged_tau_tree(full_tree(2, 2)) >= res.position_averaged_tau_chain(2)
    # the replay: one record slice per record (packed rows split back), the same as a per-record walk
    lengths = [len(r.input_ids) for r in eval_captured]
    assert res.segments == tuple(n - 2 for n in lengths)
    for k in (1, 3):
        rounds, tokens = _naive_replay(res.ranks, res.valid, lengths, k)
        replay = res.replay_chain(k)
        assert (replay.rounds, replay.tokens) == (rounds, tokens) and rounds > 0
        assert res.tau_chain(k) == pytest.approx(tokens / rounds)
    assert s["predicted_tau_chain"] == pytest.approx([res.tau_chain(k) for k in (1, 2, 3)])
    assert s["position_averaged_tau_chain"] == pytest.approx(
        [res.position_averaged_tau_chain(k) for k in (1, 2, 3)]
    )
    assert (
        len(s["predicted_per_position_acceptance"]) == 3 and s["replay_rounds"] == res.replay_chain(3).rounds
    )


def test_tokenized_data_on_another_target_names_the_draft_and_the_live_target(
    peaked_target, peaked_contract, token_records
):
    """Online evaluation: the live target computes the states, so a mismatch is the target's, shown as
    `--target=` (not `data=`), with the fix pointing at the draft's own target."""
    from eaglewire.errors import ContractMismatchError
    from eaglewire.train.target_side import OnlineTarget

    draft = init_draft(peaked_target, peaked_contract, seed=0)
    trained_on = replace(peaked_contract.target, tokenizer_hash="another", name="/models/the-drafts-target")
    draft_contract = replace(peaked_contract, target=trained_on)
    side = OnlineTarget(peaked_target, peaked_contract, draft.get_buffer("draft_to_target"))
    with pytest.raises(ContractMismatchError) as e:
        evaluate_draft(draft, draft_contract, side, token_records, num_steps=2, max_length=64)
    msg = str(e.value)
    assert "not the target the draft was trained for" in msg
    assert "target.tokenizer_hash: draft contract=another --target=" in msg and "data=" not in msg
    assert "pass the draft's own target, --target /models/the-drafts-target" in msg
