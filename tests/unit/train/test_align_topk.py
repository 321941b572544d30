"""`TrainConfig.align_topk` (GRIFFIN's token alignment): step s trains only on the rows a served draft
reaches, and the loss of those rows is exactly what the unaligned objective gives them."""

from __future__ import annotations

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.errors import ConfigError
from eaglewire.target.identity import build_contract
from eaglewire.train.batches import Batch
from eaglewire.train.config import TrainConfig
from eaglewire.train.loss import in_top_k, restrict_target_logits, target_rank, target_to_draft
from eaglewire.train.objective import TTTObjective
from eaglewire.train.target_side import TrainInputs
from tests.helpers.tiny import make_tiny_target

S = 4


@pytest.fixture(scope="module")
def setup():
    target = make_tiny_target("llama", num_layers=8)
    draft = init_draft(target, build_contract(target, fingerprint=False), seed=3).eval()
    g = torch.Generator().manual_seed(7)
    B, T, V = 2, 40, draft.config.vocab_size
    doc = torch.zeros(B, T, dtype=torch.long)
    doc[0, 25:] = 1  # two records in row 0
    pos = torch.cat([torch.arange(25), torch.arange(15)])[None].expand(B, T).clone()
    pos[1] = torch.arange(T)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, :3] = False
    batch = Batch(torch.randint(3, V, (B, T), generator=g), mask, pos, doc, rows=(), record_ids=())
    aux = torch.randn(B, T, draft.config.aux_width, generator=g)
    d2t = draft.get_buffer("draft_to_target")
    # a peaked target with its argmax mostly among the draft's own top few: every alignment keeps some rows
    logits = torch.randn(B, T, V, generator=g) * 4.0
    dist = restrict_target_logits(logits, d2t, target_to_draft(d2t, V))
    return draft, TrainInputs(batch, aux, dist)


def loss_over(monkeypatch, inputs: TrainInputs, draft, step: int, keep: torch.Tensor) -> torch.Tensor:
    """Step `step`'s loss sum of the unaligned objective, over the valid rows where `keep` holds."""
    import eaglewire.train.objective as objective_module

    real = objective_module.step_outcome
    calls = []

    def kept(*args, **kwargs):
        if len(calls) == step:
            kwargs["trained"] = keep
        calls.append(step)
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(objective_module, "step_outcome", kept)
        return TTTObjective(draft, S)(inputs).loss_sums[step]


@torch.no_grad()
@pytest.mark.parametrize("k", [1, 3])
def test_aligned_loss_is_the_plain_loss_over_the_rows_that_serving_reaches(setup, monkeypatch, k):
    draft, inputs = setup
    aligned = TTTObjective(draft, S, align_topk=k)(inputs).loss_sums  # [S]
    plain = TTTObjective(draft, S)(inputs, with_ranks=True)
    assert plain.ranks is not None
    torch.testing.assert_close(aligned[0], plain.loss_sums[0], rtol=1e-6, atol=1e-6)  # step 0: every row
    reach = torch.ones_like(inputs.batch.loss_mask)  # [B, T] top-k right at every earlier step
    for s in range(S):
        torch.testing.assert_close(
            aligned[s], loss_over(monkeypatch, inputs, draft, s, reach), rtol=1e-5, atol=1e-5
        )
        reach = reach & (plain.ranks[s] < k)
    assert aligned[S - 1] < plain.loss_sums[S - 1]  # rows were dropped by the last step


@torch.no_grad()
def test_in_top_k_matches_the_rank_on_all_rows_and_on_scored_rows(setup):
    draft, inputs = setup
    B, T = inputs.batch.input_ids.shape
    logits = torch.randn(B, T, draft.config.draft_vocab_size, generator=torch.Generator().manual_seed(1))
    rank = target_rank(logits, inputs.target)  # [B, T]
    for k in (1, 2, 5):
        torch.testing.assert_close(in_top_k(logits, inputs.target, k, None, rank.shape), rank < k)
        scored = torch.arange(0, B * T, 3)  # every third row
        got = in_top_k(logits.reshape(B * T, -1)[scored], inputs.target, k, scored, rank.shape)
        expected = torch.zeros(B * T, dtype=torch.bool)
        expected[scored] = (rank < k).reshape(-1)[scored]
        assert torch.equal(got.reshape(-1), expected)


def test_align_topk_below_zero_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="align_topk.*-1"):
        TrainConfig(align_topk=-1)
