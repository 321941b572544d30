"""Capture at boundary b equals output_hidden_states[b]; the pre-norm final equals the last layer output.

This pins the numbering with a test, on every supported architecture.
"""

import pytest
import torch

from eaglewire.contract.contract import FinalState
from eaglewire.contract.fingerprint import StateKey
from eaglewire.target.capture import capture, capture_all
from tests.helpers.tiny import CAPTURE_ARCHITECTURES, make_tiny_target


@pytest.fixture(scope="module", params=CAPTURE_ARCHITECTURES)
def target(request):
    return make_tiny_target(request.param)


def test_boundaries_equal_hf_hidden_states(target):
    ids = torch.randint(0, target.vocab_size, (2, 9))
    hf = target.model(ids, output_hidden_states=True).hidden_states
    L = target.num_layers
    states = capture_all(target.model, ids)
    for b in range(L):
        torch.testing.assert_close(states[StateKey(b)], hf[b], rtol=0, atol=0)
    # Hugging Face's last entry is *after* the final norm: it is not boundary L.
    torch.testing.assert_close(states[StateKey(L, "post")], hf[L], rtol=0, atol=0)
    assert not torch.allclose(states[StateKey(L)], hf[L])


def test_pre_norm_final_is_last_layer_output(target):
    ids = torch.randint(0, target.vocab_size, (1, 7))
    captured = {}
    last = target.model.model.layers[-1]
    h = last.register_forward_hook(
        lambda m, a, out: captured.setdefault("out", out[0] if isinstance(out, tuple) else out)
    )
    try:
        states = capture_all(target.model, ids)
    finally:
        h.remove()
    torch.testing.assert_close(states[StateKey(target.num_layers)], captured["out"])


def test_capture_concatenates_in_contract_order(target):
    ids = torch.randint(0, target.vocab_size, (2, 5))
    L = target.num_layers
    got = capture(target.model, ids, aux_boundaries=(5, 0, 2), final=FinalState(L, "pre"), return_logits=True)
    states = capture_all(target.model, ids)
    H = target.hidden_size
    assert got.aux.shape == (2, 5, 3 * H)
    torch.testing.assert_close(got.aux[..., :H], states[StateKey(5)])
    torch.testing.assert_close(got.aux[..., H : 2 * H], states[StateKey(0)])
    torch.testing.assert_close(got.final, states[StateKey(L)])
    assert got.logits is not None and got.logits.shape == (2, 5, target.vocab_size)


def test_hooks_are_removed(target):
    ids = torch.randint(0, target.vocab_size, (1, 4))
    capture_all(target.model, ids)
    assert all(not layer._forward_pre_hooks for layer in target.model.model.layers)
    assert not target.model.model.norm._forward_hooks


def test_packed_records_with_a_custom_mask_equal_each_record_alone(target):
    """Online training runs several records packed in one row: an additive [B, 1, T, T] mask keeps
    each record to itself and position ids restart per record; every state and logit then equals
    the record's own forward, on every architecture."""
    from eaglewire.train.ttt import prefix_mask

    lengths = [5, 8, 3]
    g = torch.Generator().manual_seed(0)
    records = [torch.randint(3, target.vocab_size, (n,), generator=g) for n in lengths]
    T = sum(lengths) + 2  # two padding slots at the end of the row
    ids = torch.zeros(1, T, dtype=torch.long)
    positions = torch.zeros(1, T, dtype=torch.long)
    docs = torch.full((1, T), -1)
    offset = 0
    for d, rec in enumerate(records):
        ids[0, offset : offset + len(rec)] = rec
        positions[0, offset : offset + len(rec)] = torch.arange(len(rec))
        docs[0, offset : offset + len(rec)] = d
        offset += len(rec)
    allowed = prefix_mask(docs)[:, None]
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    final = FinalState(target.num_layers, "pre")
    packed = capture(
        target.model,
        ids,
        aux_boundaries=[1, 2],
        final=final,
        attention_mask=mask,
        position_ids=positions,
        return_logits=True,
    )
    offset = 0
    for rec in records:
        alone = capture(target.model, rec[None], aux_boundaries=[1, 2], final=final, return_logits=True)
        at = slice(offset, offset + len(rec))
        torch.testing.assert_close(packed.aux[0, at], alone.aux[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(packed.final[0, at], alone.final[0], rtol=1e-4, atol=1e-5)
        assert packed.logits is not None and alone.logits is not None
        torch.testing.assert_close(packed.logits[0, at], alone.logits[0], rtol=1e-4, atol=1e-4)
        offset += len(rec)
