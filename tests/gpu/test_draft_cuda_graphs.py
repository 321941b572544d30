"""On CUDA, drafting replayed from CUDA graphs gives the same trees and the same greedy text as
eager drafting, and speculative greedy output still equals plain greedy output (float32).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.factory import make_runner
from tests.gpu.conftest import SPECS, TOKENS, tiny_on_cuda
from tests.unit.engine.conftest import Tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def cuda_tiny() -> tuple[Tiny, torch.nn.Module]:
    return tiny_on_cuda(TOKENS)


@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "graphs+compile"])
@pytest.mark.parametrize("shape", sorted(SPECS))
def test_graphed_drafting_matches_eager_and_plain(cuda_tiny, shape, compile):
    tiny, trained = cuda_tiny
    results = {}
    for graphs in (False, True):
        runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=256)
        dec = SpeculativeDecoder(runner, trained, SPECS[shape], tokenizer=tiny.target.tokenizer)
        dec.drafter = Drafter(
            trained, SPECS[shape], max_seq_len=256, cuda_graphs=graphs, compile=compile and graphs
        )
        results[graphs] = [dec.generate(p, max_new_tokens=TOKENS) for p in tiny.prompts]
        if graphs:
            assert dec.drafter._graphs is not None and len(dec.drafter._graphs) > 0, "no graph was captured"
            if compile:  # the whole round compiled, not the fallback to the compiled forward alone
                assert dec.drafter._tree_fn is not dec.drafter._tree_body
    for eager, graphed, reference in zip(results[False], results[True], tiny.references, strict=True):
        assert graphed.token_ids == reference
        assert eager.token_ids == reference
        assert graphed.num_verifications == eager.num_verifications  # same trees accepted the same drafts
