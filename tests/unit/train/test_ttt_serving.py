"""TTT computes, for every position and step, exactly what a serving decoder computes.

The reference here decodes the way an engine does: run the draft over the prefix rows 0..t with
the target's aux states (one causal call, keys into a GrowingKV), then feed the draft its own
pre-norm hidden state and the next token one step at a time (position t+s, attending to all
keys so far). Ground-truth tokens are fed on both sides.
"""

from __future__ import annotations

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.draft.model import GrowingKV
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.train.ttt import prefix_mask, shift_left, step_in_range, ttt_attention_mask, ttt_unroll
from tests.helpers.tiny import make_tiny_target

S = 4


@pytest.fixture(scope="module")
def setup():
    target = make_tiny_target("llama", num_layers=8)
    contract = build_contract(target, fingerprint=False)
    draft = init_draft(target, contract, seed=3).eval()
    # Randomise the (otherwise small) layer weights so a wrong mask/position shows up in the logits.
    with torch.no_grad():
        for p in draft.layer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return target, contract, draft


def serving_logits(draft, aux, ids, t: int, steps: int) -> list[torch.Tensor]:
    """Draft logits of a chain starting after row t, decoded step by step. aux [1,T,A*Ht], ids [1,T]."""
    kv = GrowingKV()
    hidden = draft.project(aux[:, : t + 1])
    out = draft(ids[:, 1 : t + 2], hidden, torch.arange(t + 1)[None], kv=kv)  # prefix rows 0..t
    logits = [out.logits[:, -1]]
    h = out.hidden[:, -1:]
    for s in range(1, steps):
        out = draft(
            ids[:, t + 1 + s : t + 2 + s], h, torch.tensor([[t + s]]), kv=kv
        )  # mask None: sees all keys
        logits.append(out.logits[:, -1])
        h = out.hidden
    return logits


@torch.no_grad()
def test_ttt_equals_step_by_step_serving(setup):
    target, contract, draft = setup
    torch.manual_seed(0)
    T = 20
    ids = torch.randint(3, target.vocab_size, (1, T))
    aux = capture(target.model, ids, aux_boundaries=contract.aux_boundaries, final=contract.final).aux
    doc = torch.zeros(1, T, dtype=torch.long)
    outs = list(ttt_unroll(draft, ids, torch.arange(T)[None], doc, aux, S))
    checked = 0
    for t in range(T - 2 - (S - 1)):  # rows whose whole chain has labels
        ref = serving_logits(draft, aux, ids, t, S)
        for s in range(S):
            torch.testing.assert_close(outs[s].logits[:, t], ref[s], rtol=1e-5, atol=1e-5, msg=f"t={t} s={s}")
            checked += 1
    assert checked == (T - 1 - S) * S


@torch.no_grad()
def test_packed_rows_equal_separate_records(setup):
    """Two records packed in one row give the same per-record logits as each record alone."""
    target, contract, draft = setup
    torch.manual_seed(1)
    a = torch.randint(3, target.vocab_size, (1, 11))
    b = torch.randint(3, target.vocab_size, (1, 9))

    def aux_of(x):
        return capture(target.model, x, aux_boundaries=contract.aux_boundaries, final=contract.final).aux

    packed_ids = torch.cat([a, b], 1)
    packed_aux = torch.cat([aux_of(a), aux_of(b)], 1)
    pos = torch.cat([torch.arange(11), torch.arange(9)])[None]
    doc = torch.cat([torch.zeros(11), torch.ones(9)]).long()[None]
    packed = list(ttt_unroll(draft, packed_ids, pos, doc, packed_aux, S))
    alone_a = list(ttt_unroll(draft, a, torch.arange(11)[None], torch.zeros(1, 11).long(), aux_of(a), S))
    alone_b = list(ttt_unroll(draft, b, torch.arange(9)[None], torch.zeros(1, 9).long(), aux_of(b), S))
    for s in range(S):
        ok = step_in_range(doc, s)[0]
        assert ok[:11].sum() == 11 - 2 - s and ok[11:].sum() == 9 - 2 - s
        ra, rb = ok[:11], ok[11:]
        torch.testing.assert_close(
            packed[s].logits[0, :11][ra], alone_a[s].logits[0][ra], rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(
            packed[s].logits[0, 11:][rb], alone_b[s].logits[0][rb], rtol=1e-5, atol=1e-5
        )


def test_mask_shape_and_diagonal():
    doc = torch.tensor([[0, 0, 0, 1, 1, -1]])
    m = ttt_attention_mask(doc, 2)[0, 0]
    assert m.shape == (6, 18)
    assert m[2, :6].tolist() == [True, True, True, False, False, False]
    assert m[4, :6].tolist() == [False, False, False, True, True, False]
    for j in (1, 2):
        assert m[:, 6 * j : 6 * (j + 1)].equal(torch.eye(6, dtype=torch.bool))


def dense_unroll(draft, ids, positions, doc, aux, steps: int) -> list:
    """The reference TTT: `Eagle3Draft.forward` over every key so far (a GrowingKV) with the dense mask."""
    kv, hidden, prefix, outs = GrowingKV(), draft.project(aux), prefix_mask(doc), []
    for s in range(steps):
        mask = ttt_attention_mask(doc, s, prefix)
        out = draft(shift_left(ids, 1 + s), hidden, positions + s, kv=kv, mask=mask)
        outs.append(out)
        hidden = out.hidden
    return outs


@pytest.mark.parametrize("block_rows", [128, 8, 7])
def test_unroll_equals_the_dense_mask_reference(setup, monkeypatch, block_rows):
    """`ttt_unroll` attends per block of rows to the prefix and the block's own chain keys; values
    and gradients equal the dense (S+1)*T-key form run through the draft's own forward, on packed
    rows with padding (block_rows 8: 3 whole blocks of the 24 rows; 7: a padded last block)."""
    import eaglewire.train.ttt as ttt

    monkeypatch.setattr(ttt, "BLOCK_ROWS", block_rows)
    target, contract, draft = setup
    torch.manual_seed(2)
    B, T = 2, 24
    doc = torch.tensor([[0] * 10 + [1] * 9 + [2] * 5, [0] * 15 + [1] * 6 + [-1] * 3])
    positions = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for d in doc[b].unique():
            where = doc[b] == d
            positions[b, where] = torch.arange(int(where.sum()))
    ids = torch.randint(3, target.vocab_size, (B, T))
    aux = torch.randn(B, T, draft.config.aux_width)
    weights = [torch.randn(B, T, draft.config.draft_vocab_size) for _ in range(S)]
    grads = []
    for unroll in (ttt_unroll, dense_unroll):
        draft.zero_grad()
        outs = list(unroll(draft, ids, positions, doc, aux, S))
        sum((o.logits * w).sum() for o, w in zip(outs, weights, strict=True)).backward()
        grads.append({k: p.grad.clone() for k, p in draft.named_parameters() if p.grad is not None})
        if unroll is ttt_unroll:
            ours = [o.logits.detach() for o in outs]
        else:
            for s in range(S):
                torch.testing.assert_close(
                    ours[s], outs[s].logits.detach(), rtol=1e-5, atol=1e-5, msg=f"s={s}"
                )
    assert grads[0].keys() == grads[1].keys() and "layer.self_attn.k_proj.weight" in grads[0]
    for k in grads[0]:
        # relative to the whole tensor, not per element: float32 sums in another order (per block vs
        # dense) left one of embed_tokens' 24,576 scatter-added entries 1.3e-5 off (AVX-512 CPU),
        # while a wrong mask moves a gradient by a sizeable part of its norm
        error = float((grads[0][k] - grads[1][k]).norm() / grads[1][k].norm().clamp_min(1e-12))
        assert error < 1e-5, f"{k}: relative error {error:.2e}"
    draft.zero_grad()
