"""On CUDA, the compiled FlexAttention form of the TTT chain trains what the blocked form trains:
the same losses and the same gradients of every draft parameter (float32), over packed rows whose
length is not a multiple of the block size, and records that span several blocks (full blocks, where
no mask is applied); and an unroll never waits for the GPU.

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


ROWS = {200: [[60, 90, 50], [150, 30], [200]], 600: [[40, 300, 170, 50], [600], [10, 20, 30]]}


def tiny_draft() -> torch.nn.Module:
    target = make_tiny_target("llama", num_layers=8)
    return init_draft(target, build_contract(target, fingerprint=False), seed=7).cuda()


@pytest.mark.parametrize("T", sorted(ROWS))
def test_flex_gradients_equal_blocked_gradients_on_cuda(T: int) -> None:
    draft = tiny_draft()
    cfg = draft.config
    ids, pos, doc, aux = (x.cuda() for x in packed(ROWS[T], T, cfg.aux_width, cfg.vocab_size))
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


def test_flex_unroll_does_not_synchronize() -> None:
    """A host-device sync inside the unroll (e.g. a step tensor copied from pageable host memory) stops
    the next batch's preparation from overlapping this one's kernels: on the H200 the synced phases
    of a flex step took 141 ms, but steps in the loop 173 ms against 154 for the blocked form."""
    draft = tiny_draft()
    cfg = draft.config
    ids, pos, doc, aux = (x.cuda() for x in packed(ROWS[600], 600, cfg.aux_width, cfg.vocab_size))
    list(ttt_unroll(draft, ids, pos, doc, aux, S, attention="flex"))  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = list(ttt_unroll(draft, ids, pos, doc, aux, S, attention="flex"))
        sum(o.logits.float().mean() for o in outs).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
