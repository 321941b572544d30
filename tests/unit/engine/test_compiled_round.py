"""The compiled draft round (`Drafter._tree_fn`, torch.compile with dynamic=True) traces as one graph:
no graph break, no frame of its own for the beam's bookkeeping, one compile per attended window.

On torch 2.11 (the GPU image) a symbolic KV-head count of the draft cache made the attention's
`enable_gqa` a SymBool, which scaled_dot_product_attention rejected: a graph break inside the
round's depth loop, so dynamo ran `_draft_rows` eagerly and compiled `CandidatePool.add` once per
pool length until the recompile limit. The backend here counts graphs and runs them as traced
(graph breaks come from tracing, not from the backend): no inductor, so seconds on a CPU."""

from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from eaglewire.engine.drafting import CACHE_FIXED_DIMS, TOP_K_ROUND, Drafter
from eaglewire.engine.spec_args import SpecArgs

# dynamo's first compile imports torch.utils.mkldnn, whose torch.jit.script_method warns (torch's own)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

SPECS = {"tree": SpecArgs(num_steps=4, topk=2, num_draft_tokens=8), "chain": SpecArgs.chain(4)}
MAX_SEQ_LEN = 128
PROMPT_ROWS = 5
ROUNDS = 3
ACCEPTED_ROWS = 3  # rows each round's verification commits (> 1: torch.compile specialises size 1)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def rows(draft, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n draft rows: aux [n, A*Ht] and the tokens after them [n]."""
    aux = torch.randn(n, draft.config.aux_width, generator=generator)
    return aux, torch.randint(0, draft.config.vocab_size, (n,), generator=generator)


def compiled_round(drafter: Drafter, root_token: int, root_position: int) -> tuple[torch.Tensor, ...]:
    """What `draft_tree` does, with the compiled round that a CUDA graph would capture (on CPU the
    drafter never calls it): publish root and committed count, then run `_tree_fn`."""
    assert drafter.last_hidden is not None and drafter.last_logits is not None
    window = drafter._prepare(drafter.committed + drafter.tree_rows)
    drafter._committed.fill_(drafter.committed)
    drafter._root_token.fill_(root_token)
    drafter._root_position.fill_(root_position)
    with torch.no_grad():
        return drafter._tree_fn(drafter.last_hidden, drafter.last_logits, TOP_K_ROUND, window)


def check_compiled_round(draft, spec: SpecArgs, monkeypatch) -> None:
    """Rounds of a compiled and an eager drafter from the same rows give the same tensors; the
    compiled round was traced as one graph (also run on CUDA by tests/gpu/test_compiled_round_cuda.py)."""
    compiled_graphs = CompileCounter()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=compiled_graphs))
    compiled = Drafter(draft, spec, max_seq_len=MAX_SEQ_LEN, cuda_graphs=False, compile=True)
    eager = Drafter(draft, spec, max_seq_len=MAX_SEQ_LEN, cuda_graphs=False, compile=False)
    generator = torch.Generator().manual_seed(0)
    aux, tokens = rows(draft, PROMPT_ROWS, generator)
    for _ in range(ROUNDS):
        compiled.extend(aux, tokens, start_position=eager.committed)
        eager.extend(aux, tokens, start_position=eager.committed)
        root = int(tokens[-1])
        got = compiled_round(compiled, root, eager.committed)
        want = eager.draft_tree(root, eager.committed, TOP_K_ROUND)
        for name, g, w in zip(
            ("tokens", "parents", "depths", "scores", "ancestors"),
            got,
            (want.tokens, want.parents, want.depths, want.scores, want.ancestor_mask()),
            strict=True,
        ):
            if g.is_floating_point():  # compiled kernels may sum in another order (AVX2 vs AVX-512)
                torch.testing.assert_close(g, w, msg=name)
            else:
                assert torch.equal(g, w), name
        aux, tokens = rows(draft, ACCEPTED_ROWS, generator)
    breaks = list(counters["graph_break"])
    assert not breaks, "graph breaks in the compiled round:\n" + "\n".join(breaks)
    # one graph for the extend's forward, one for the whole round: the round's window never changed
    # here, and no call inside it (CandidatePool.add, the forward) was compiled as a frame of its own
    assert compiled_graphs.frame_count == 2


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_compiled_round_is_one_graph_and_matches_eager(tiny, monkeypatch, fresh_dynamo, shape):
    check_compiled_round(tiny.untrained, SPECS[shape], monkeypatch)


def test_cache_buffers_keep_their_fixed_dims_static_when_they_grow(tiny):
    """What keeps the KV-head count an int under dynamic=True on every torch version (torch 2.13
    happens to specialise it during tracing; 2.11 does not, and then the round breaks)."""
    drafter = Drafter(tiny.untrained, SPECS["tree"], cuda_graphs=False, compile=True)
    capacity = drafter.cache.capacity
    drafter.reserve(2 * capacity)  # reallocates the buffers
    assert drafter.cache.capacity > capacity
    for buffer in (drafter.cache.key, drafter.cache.value):
        assert getattr(buffer, "_dynamo_static_indices", set()) == set(CACHE_FIXED_DIMS)
