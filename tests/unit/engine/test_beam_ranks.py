"""The beam's sort-free selections equal a stable descending sort, ties included, and the
top-k with log-probabilities equals torch's top-k and log-softmax (the CPU path; the Triton
kernels are checked against the same reference in tests/gpu/test_top_k_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.beam import stable_ranks, top_indices, top_k_log_probs_for
from eaglewire.engine.tree import select_nodes


def few_values(g: torch.Generator, n: int) -> torch.Tensor:
    """Scores drawn from 5 values: most entries tie with others."""
    return torch.randint(0, 5, (n,), generator=g).float() * -0.25


@pytest.mark.parametrize("seed", range(20))
def test_stable_ranks_and_top_indices_equal_a_stable_sort(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 200, (1,), generator=g))
    scores = few_values(g, n) if seed % 2 else torch.randn(n, generator=g)
    order = torch.sort(scores, descending=True, stable=True).indices
    ranks = stable_ranks(scores)
    assert torch.equal(order[ranks], torch.arange(n))  # each entry sits at its rank
    k = int(torch.randint(1, n + 1, (1,), generator=g))
    assert torch.equal(top_indices(scores, k), order[:k])


def sorted_select(scores: torch.Tensor, parents: torch.Tensor, n: int) -> tuple[list[int], list[int]]:
    """select_nodes as it was written with sorts: the reference."""
    kept = torch.sort(scores, descending=True, stable=True).indices[:n].sort().values
    node_of = torch.full_like(parents, -1)
    node_of[kept] = torch.arange(1, n + 1)
    kp = parents[kept]
    node_parents = torch.where(kp < 0, torch.zeros_like(kp), node_of[kp.clamp(min=0)])
    return kept.tolist(), [-1, *node_parents.tolist()]


@pytest.mark.parametrize("seed", range(20))
def test_select_nodes_equals_the_sorted_selection(seed: int) -> None:
    """A beam's pool: K roots, then K children of each of K frontier nodes per level, scores
    cumulative (a child never above its parent), many ties."""
    g = torch.Generator().manual_seed(seed)
    K, levels = 3, 4
    scores, parents = [], []
    frontier = list(range(K))
    scores += sorted(few_values(g, K).tolist(), reverse=True)
    parents += [-1] * K
    for _ in range(levels - 1):
        new = []
        for p in frontier:
            for _ in range(K):
                parents.append(p)
                scores.append(scores[p] + float(few_values(g, 1)))
                new.append(len(scores) - 1)
        frontier = new[:K]
    s, par = torch.tensor(scores), torch.tensor(parents)
    n = int(torch.randint(1, len(scores) + 1, (1,), generator=g))
    kept, node_parents = select_nodes(s, par, n)
    assert (kept.tolist(), node_parents.tolist()) == sorted_select(s, par, n)


@pytest.mark.parametrize("k", [1, 4, 12])
def test_top_k_log_probs_equals_topk_of_log_softmax(k: int) -> None:
    logits = torch.randn(5, 2048, generator=torch.Generator().manual_seed(k)) * 4
    ids, logp = top_k_log_probs_for(logits.device)(
        logits, k
    )  # float32: no ties (torch.topk orders ties as it likes)
    expected = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
    assert torch.equal(ids, expected.indices)
    torch.testing.assert_close(logp, expected.values, rtol=0, atol=1e-5)
