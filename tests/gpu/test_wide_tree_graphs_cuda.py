"""On CUDA a tree wider than the runner's default graphed width (128 new tokens) still verifies
through a CUDA graph: a 160-node tree's forwards are graphed (a key with N=160 is captured and no
"runs without CUDA graphs" warning is logged), and greedy output still equals plain greedy output.
Before the decoder reserved its width, a 256-node tree ran eagerly on the H200 at 145 tok/s
against 1,272 for 128 nodes (docs/history/benchmarks-log.md §2p).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import logging

import pytest
import torch

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.spec_args import SpecArgs
from tests.gpu.conftest import TOKENS, tiny_on_cuda

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

WIDE = SpecArgs(num_steps=6, topk=8, num_draft_tokens=160)


def test_wide_tree_verifies_through_a_graph_and_stays_lossless(caplog):
    tiny, trained = tiny_on_cuda(TOKENS)
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=512)
    dec = SpeculativeDecoder(runner, trained, WIDE, tokenizer=tiny.target.tokenizer)
    with caplog.at_level(logging.WARNING, logger="eaglewire.engine.runners.fast.runner"):
        results = [dec.generate(p, max_new_tokens=TOKENS) for p in tiny.prompts]
    for result, reference in zip(results, tiny.references, strict=True):
        assert result.token_ids == reference
    assert not [r for r in caplog.records if "without CUDA graphs" in r.getMessage()]
    graphs = runner._graphs
    assert graphs is not None
    widths = {key[1] for key in graphs._graphs}  # key = (B, N, window, has_tree, has_at, greedy)
    assert WIDE.num_draft_tokens in widths, widths
