"""The FlexAttention form of the TTT chain computes what the blocked form (and the dense mask) does,
and compiles once for every step and batch of one padded length.

CPU runs FlexAttention's forward only (it has no CPU backward); `tests/gpu/test_ttt_flex_cuda.py`
checks the gradients."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from eaglewire.draft.init import init_draft
from eaglewire.errors import ConfigError
from eaglewire.target.identity import build_contract
from eaglewire.train import ttt_flex
from eaglewire.train.config import TrainConfig
from eaglewire.train.objective import TTTObjective
from eaglewire.train.ttt import step_in_range, ttt_attention_mask, ttt_unroll
from eaglewire.train.ttt_flex import BLOCK, chain_block_masks, prefix_blocks
from tests.helpers.tiny import make_tiny_target

S = 4


@pytest.fixture(scope="module")
def draft():
    target = make_tiny_target("llama", num_layers=8)
    d = init_draft(target, build_contract(target, fingerprint=False), seed=5).eval()
    with torch.no_grad():  # larger layer weights: a wrong mask shows in the logits
        for p in d.layer.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return d


def packed(lengths_per_row: list[list[int]], T: int, aux_width: int, vocab: int, seed: int = 0):
    """Rows of records back to back (positions restart per record, doc -1 after the last)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths_per_row)
    doc = torch.full((B, T), -1, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    k = 0
    for b, lengths in enumerate(lengths_per_row):
        t = 0
        for n in lengths:
            doc[b, t : t + n], pos[b, t : t + n] = k, torch.arange(n)
            t, k = t + n, k + 1
    ids = torch.randint(3, vocab, (B, T), generator=g)
    aux = torch.randn(B, T, aux_width, generator=g)
    return ids, pos, doc, aux


@pytest.mark.parametrize("T", [150, 2 * BLOCK, 600])  # padded to 256 rows; two blocks; records over 4 blocks
@torch.no_grad()
def test_flex_chain_equals_blocked_chain(draft, T):
    cfg = draft.config
    ids, pos, doc, aux = packed([[40, 70, T - 110], [T - 20]], T, cfg.aux_width, cfg.vocab_size)
    blocked = list(ttt_unroll(draft, ids, pos, doc, aux, S, attention="blocked"))
    flex = list(ttt_unroll(draft, ids, pos, doc, aux, S, attention="flex"))
    for s, (a, b) in enumerate(zip(blocked, flex, strict=True)):
        rows = step_in_range(doc, s)  # [B, T] rows whose label lies in their record
        assert rows.sum() > 0
        torch.testing.assert_close(b.logits[rows], a.logits[rows], rtol=1e-4, atol=1e-5, msg=f"step {s}")


def test_block_masks_equal_the_dense_mask():
    T = 150
    _, _, doc, _ = packed([[30, 50, 60], [100]], T, 1, 10)
    Tp = T + (-T % BLOCK)
    doc_p = torch.nn.functional.pad(doc, (0, Tp - T), value=-1)
    masks = chain_block_masks(doc_p, S)
    b = torch.arange(doc.shape[0])[:, None, None]
    q = torch.arange(T)[None, :, None]
    for s in range(S):
        dense = ttt_attention_mask(doc, s)[:, 0]  # [B, T, (s+1)*T]
        # the block mask's own elementwise rule over the padded key layout (key block j = step j)
        kv = torch.cat([j * Tp + torch.arange(T) for j in range(s + 1)])[None, None, :]
        got = masks[s].mask_mod(b, torch.zeros(()), q, kv)  # [B, T, (s+1)*T]
        assert torch.equal(got, dense), f"step {s}"
        if s + 1 < S:  # keys of later steps are never visible
            later = (s + 1) * Tp + torch.arange(Tp)[None, None, :]
            assert not masks[s].mask_mod(b, torch.zeros(()), q, later).any()


def test_block_lists_cover_every_visible_key_and_full_blocks_are_all_visible():
    """The block lists are built from record-id ranges, not from the mask: a visible (row, key) pair
    outside them would silently drop attention, a full block with a hidden key would leak it."""
    T = 5 * BLOCK  # records over several blocks (full blocks), short ones sharing a block, padding
    _, _, doc, _ = packed([[40, 300, 170, 50], [600], [10, 20, 30]], T, 1, 10)
    partial, full = prefix_blocks(doc)  # [B, NB, NB]
    dense = ttt_attention_mask(doc, 0)[:, 0]  # [B, T, T]
    B, nb = doc.shape[0], T // BLOCK
    per_block = dense.view(B, nb, BLOCK, nb, BLOCK)
    any_visible, all_visible = per_block.any(dim=(2, 4)), per_block.all(dim=(2, 4))  # [B, NB, NB]
    assert not (any_visible & ~(partial | full)).any()
    assert not (full & ~all_visible).any()
    assert not (partial & full).any()
    assert full.any() and (partial & ~any_visible).sum() < partial.sum()  # both kinds really occur
    for s, mask in enumerate(chain_block_masks(doc, S)):
        listed = mask.to_dense()[:, 0]  # [B, NB, S*NB]: partial and full blocks
        chain = torch.cat([torch.eye(nb, dtype=torch.bool).expand(B, nb, nb) if 1 <= j <= s
                           else torch.zeros(B, nb, nb, dtype=torch.bool) for j in range(S)], dim=-1)  # fmt: skip
        expected = (
            torch.cat([partial | full, torch.zeros(B, nb, (S - 1) * nb, dtype=torch.bool)], dim=-1) | chain
        )
        assert torch.equal(listed.bool(), expected), f"step {s}"


@torch.no_grad()
def test_flex_chain_compiles_once_across_steps_and_batches(draft, monkeypatch):
    """A step or batch that recompiled the kernel would, past dynamo's limit, fall back to the
    unfused path (on the H200: 618 ms a pass against 98 ms blocked). The eager backend traces and
    guards exactly as inductor does, without a C++ build."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setitem(
        ttt_flex._compiled, "flex", torch.compile(flex_attention, backend="eager", dynamic=False)
    )
    cfg = draft.config
    for seed, lengths in enumerate(([[50, 60], [110]], [[20, 30, 40], [90, 25]], [[115], [60, 55]])):
        ids, pos, doc, aux = packed(
            lengths, 117 + seed, cfg.aux_width, cfg.vocab_size, seed
        )  # all pad to 128
        list(ttt_unroll(draft, ids, pos, doc, aux, S, attention="flex"))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_flex_refused_off_cuda(draft):
    with pytest.raises(ConfigError, match="ttt_attention='flex' needs the draft on a CUDA device"):
        TTTObjective(draft, S, attention="flex")
    with pytest.raises(ConfigError, match="ttt_attention: expected one of"):
        TrainConfig(ttt_attention="dense")
    with pytest.raises(ValueError, match="expected 'blocked' or 'flex'"):
        next(iter(ttt_unroll(draft, *packed([[10]], 10, draft.config.aux_width, 20), S, attention="x")))
