"""On CUDA, the compiled FlexAttention form of the TTT chain trains what the blocked form trains:
the same losses and the same gradients of every draft parameter (float32), over packed rows whose
length is not a multiple of the block size.

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.target.identity import build_contract
from eaglewire.train.ttt import step_in_range, ttt_unroll
from tests.helpers.tiny import make_tiny_target
from tests.unit.train.test_ttt_flex import S, packed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_flex_gradients_equal_blocked_gradients_on_cuda() -> None:
    target = make_tiny_target("llama", num_layers=8)
    draft = init_draft(target, build_contract(target, fingerprint=False), seed=7).cuda()
    cfg = draft.config
    ids, pos, doc, aux = (
        x.cuda() for x in packed([[60, 90, 50], [150, 30], [200]], 200, cfg.aux_width, cfg.vocab_size)
    )
    losses, grads = {}, {}
    for form in ("blocked", "flex"):
        outs = list(ttt_unroll(draft, ids, pos, doc, aux, S, attention=form))
        loss = sum(o.logits[step_in_range(doc, s)].logsumexp(-1).mean() for s, o in enumerate(outs))
        loss.backward()
        losses[form] = float(loss)
        grads[form] = {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}
        draft.zero_grad(set_to_none=True)
    assert losses["flex"] == pytest.approx(losses["blocked"], rel=1e-5)
    assert grads["flex"].keys() == grads["blocked"].keys()
    for name, g in grads["blocked"].items():
        torch.testing.assert_close(grads["flex"][name], g, rtol=1e-4, atol=1e-6, msg=name)
