"""On CUDA the compiled draft round, with the fused Triton top-k inside it, still traces as one
graph and equals the eager round (tests/unit/engine/test_compiled_round.py pins the same on CPU,
where the torch top-k runs: the Triton op and where it is chosen must not break the graph).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from eaglewire.engine.drafting import TOP_K_ROUND, Drafter
from tests.unit.engine.conftest import tiny  # noqa: F401  (a fixture)
from tests.unit.engine.test_compiled_round import (
    ACCEPTED_ROWS,
    MAX_SEQ_LEN,
    PROMPT_ROWS,
    ROUNDS,
    SPECS,
    compiled_round,
    fresh_dynamo,  # noqa: F401  (a fixture)
    rows,
)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_compiled_round_on_cuda_is_one_graph_and_matches_eager(tiny, monkeypatch, fresh_dynamo, shape):  # noqa: F811
    compiled_graphs = CompileCounter()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=compiled_graphs))
    draft = tiny.untrained.to("cuda")
    compiled = Drafter(draft, SPECS[shape], max_seq_len=MAX_SEQ_LEN, cuda_graphs=False, compile=True)
    eager = Drafter(draft, SPECS[shape], max_seq_len=MAX_SEQ_LEN, cuda_graphs=False, compile=False)
    generator = torch.Generator().manual_seed(0)
    aux, tokens = rows(draft, PROMPT_ROWS, generator)
    for _ in range(ROUNDS):
        compiled.extend(aux, tokens, start_position=eager.committed)
        eager.extend(aux, tokens, start_position=eager.committed)
        root = int(tokens[-1])
        got = compiled_round(compiled, root, eager.committed)
        want = eager.draft_tree(root, eager.committed, TOP_K_ROUND)
        assert torch.equal(got[0], want.tokens) and torch.equal(got[1], want.parents)
        aux, tokens = rows(draft, ACCEPTED_ROWS, generator)
    breaks = list(counters["graph_break"])
    assert not breaks, "graph breaks in the compiled round:\n" + "\n".join(breaks)
    assert compiled_graphs.frame_count == 2
