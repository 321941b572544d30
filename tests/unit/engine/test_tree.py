"""Tree masks, positions and parents for hand-drawn trees, and EAGLE-2 reranking on a hand-made pool."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.tree import ancestor_mask, root_only, select_nodes, tree_from_parents

#            0  (root, position 10)
#          /   \
#         1     2
#        / \     \
#       3   4     5
#       |
#       6
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
EXPECTED_MASK = [
    # 0  1  2  3  4  5  6
    [1, 0, 0, 0, 0, 0, 0],  # 0 sees itself
    [1, 1, 0, 0, 0, 0, 0],  # 1 sees 0
    [1, 0, 1, 0, 0, 0, 0],  # 2 sees 0
    [1, 1, 0, 1, 0, 0, 0],  # 3 sees 0, 1
    [1, 1, 0, 0, 1, 0, 0],  # 4 sees 0, 1
    [1, 0, 1, 0, 0, 1, 0],  # 5 sees 0, 2
    [1, 1, 0, 1, 0, 0, 1],  # 6 sees 0, 1, 3
]
EXPECTED_DEPTHS = [0, 1, 1, 2, 2, 2, 3]
EXPECTED_POSITIONS = [10, 11, 11, 12, 12, 12, 13]
EXPECTED_CHILDREN = [[1, 2], [3, 4], [5], [6], [], [], []]


def test_hand_drawn_tree():
    tree = tree_from_parents(torch.tensor([50, 51, 52, 53, 54, 55, 56]), torch.tensor(PARENTS))
    assert tree.ancestor_mask().int().tolist() == EXPECTED_MASK
    assert tree.depths.tolist() == EXPECTED_DEPTHS
    assert tree.positions(10).tolist() == EXPECTED_POSITIONS
    assert tree.children() == EXPECTED_CHILDREN
    assert tree.num_nodes == 7 and tree.depth_limit == 3


def test_chain_is_the_topk_1_special_case():
    tree = tree_from_parents(torch.tensor([9, 8, 7, 6]), torch.tensor([-1, 0, 1, 2]))
    assert torch.equal(tree.ancestor_mask(), torch.ones(4, 4, dtype=torch.bool).tril())
    assert tree.positions(5).tolist() == [5, 6, 7, 8]
    only = root_only(42)
    assert only.tokens.tolist() == [42] and only.ancestor_mask().tolist() == [[True]]


def test_mask_walk_needs_enough_depth():
    """The walk follows parent pointers `max_depth` times: too few misses far ancestors."""
    parents = torch.tensor(PARENTS)
    assert ancestor_mask(parents, max_depth=3).int().tolist() == EXPECTED_MASK
    assert ancestor_mask(parents, max_depth=1)[6, 1].item() is False


@pytest.mark.parametrize("bad", [[0, 0], [-1, 1], [-1, 0, 3, 0], [-1, -1]])
def test_parents_must_precede_children(bad):
    with pytest.raises(ValueError):
        tree_from_parents(torch.zeros(len(bad), dtype=torch.long), torch.tensor(bad))


def test_eagle2_rerank_keeps_best_cumulative_scores():
    # Pool as a topk=2, 2-step expansion creates it: depth-1 a, b; then children of the frontier.
    #   idx: 0=a(-0.2) 1=b(-0.9) | 2=a.x(-0.5) 3=a.y(-1.6) 4=b.x(-1.0) 5=b.y(-3.0)
    scores = torch.tensor([-0.2, -0.9, -0.5, -1.6, -1.0, -3.0])
    parents = torch.tensor([-1, -1, 0, 0, 1, 1])
    kept, node_parents = select_nodes(scores, parents, 4)
    # best four: a(-0.2), a.x(-0.5), b(-0.9), b.x(-1.0) -> in creation order 0, 1, 2, 4
    assert kept.tolist() == [0, 1, 2, 4]
    # tree nodes: 0 root, 1=a, 2=b, 3=a.x, 4=b.x
    assert node_parents.tolist() == [-1, 0, 0, 1, 2]


def test_rerank_ties_keep_parents_before_children():
    # A child with probability 1 ties its parent; the parent must be kept first.
    scores = torch.tensor([-0.7, -0.7, -0.7])
    parents = torch.tensor([-1, 0, 1])
    kept, node_parents = select_nodes(scores, parents, 2)
    assert kept.tolist() == [0, 1]
    assert node_parents.tolist() == [-1, 0, 1]
