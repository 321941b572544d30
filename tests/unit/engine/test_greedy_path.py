"""Device-side greedy verification (`greedy_path`) against a host walk over random trees, and the
drafter's `top_k` against torch.topk."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.beam import TOPK_CHUNK, top_k
from eaglewire.engine.tree import tree_from_parents
from eaglewire.engine.verify import greedy_path, greedy_paths, verdict_from_path, verify_greedy


def host_walk(tokens: list[int], parents: list[int], target_next: list[int]) -> tuple[list[int], list[int]]:
    """The reference: from the root, follow the child carrying the target's choice."""
    node, path, emitted = 0, [0], []
    while True:
        emitted.append(target_next[node])
        match = next(
            (c for c in range(len(tokens)) if parents[c] == node and tokens[c] == target_next[node]), None
        )
        if match is None:
            return path, emitted
        path.append(match)
        node = match


def random_tree(g: torch.Generator, n: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Parents precede children; siblings carry distinct tokens (as top-k candidates do)."""
    parents, tokens = [-1], [0]
    for i in range(1, n):
        roomy = [j for j in range(i) if sum(p == j for p in parents) < vocab]
        parent = roomy[int(torch.randint(0, len(roomy), (1,), generator=g))]
        taken = {tokens[c] for c in range(i) if parents[c] == parent}
        free = [t for t in range(vocab) if t not in taken]
        parents.append(parent)
        tokens.append(free[int(torch.randint(0, len(free), (1,), generator=g))])
    return torch.tensor(tokens), torch.tensor(parents)


@pytest.mark.parametrize("seed", range(40))
def test_greedy_path_matches_the_host_walk(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, vocab = int(torch.randint(1, 12, (1,), generator=g)), 4  # few tokens: long agreed paths happen
    tokens, parents = random_tree(g, n, vocab)
    tree = tree_from_parents(tokens, parents)
    logits = torch.randn(n, vocab, generator=g)
    verdict = verify_greedy(tree, logits)
    path, emitted = host_walk(tokens.tolist(), parents.tolist(), logits.argmax(-1).tolist())
    assert verdict.path == path and verdict.emitted == emitted
    assert verdict.path_device is not None and verdict.path_device.tolist() == path
    assert verdict.emitted_device is not None and verdict.emitted_device.tolist() == emitted


@pytest.mark.parametrize("k", [1, 2, 4, 10])
@pytest.mark.parametrize("vocab", [64, 4 * TOPK_CHUNK, 16384])
def test_top_k_equals_torch_topk(k: int, vocab: int) -> None:
    x = torch.randn(3, vocab, generator=torch.Generator().manual_seed(k))
    values, ids = top_k(x, k)
    expected = x.topk(k, dim=-1)
    assert torch.equal(values, expected.values) and torch.equal(ids, expected.indices)


def test_greedy_paths_of_a_batch_equal_each_tree_alone() -> None:
    """Trees of one size batched together (as a batched verify forward runs them) give each tree's
    own packed path; the mask alone describes each tree."""
    g = torch.Generator().manual_seed(7)
    n, vocab = 9, 3
    trees = [tree_from_parents(*random_tree(g, n, vocab)) for _ in range(5)]
    logits = torch.randn(5, n, vocab, generator=g)
    packed = greedy_paths(
        torch.stack([t.tokens for t in trees]), torch.stack([t.ancestor_mask() for t in trees]), logits
    )
    for b, tree in enumerate(trees):
        alone = greedy_path(tree, logits[b])
        assert packed[b].tolist() == alone.tolist()
        verdict = verdict_from_path(packed[b])
        walked = host_walk(tree.tokens.tolist(), tree.parents.tolist(), logits[b].argmax(-1).tolist())
        assert (verdict.path, verdict.emitted) == walked
