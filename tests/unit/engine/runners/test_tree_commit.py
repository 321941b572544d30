"""Tree verification + commit gives the same cache as decoding the accepted path token by token."""

from __future__ import annotations

import torch

from eaglewire.engine.runners.fast.kv_cache import kv_bucket
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from tests.unit.engine.runners.tiny_targets import tiny

ATOL = 1e-4

#        0
#      /   \
#     1     2        node: 0 1 2 3 4 5   depth: 0 1 1 2 2 3
#    / \    |
#   3   4   5 ... (5 is a child of 2), node 4 gets a child? no: 6 nodes in all
PARENT = [-1, 0, 0, 1, 1, 2]
DEPTH = [0, 1, 1, 2, 2, 2]


def tree_mask() -> torch.Tensor:
    n = len(PARENT)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = PARENT[j]
    return mask


def test_tree_mask_helper_is_the_hand_drawn_matrix() -> None:
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree_mask(), expected)


def _sequential_logits(runner: FastTargetRunner, rows: list[list[int]]) -> torch.Tensor:
    """Logits after feeding each row's tokens one at a time (batch 1 each)."""
    out = []
    for row in rows:
        runner.reset(1)
        runner.forward(torch.tensor([row[:-1]]), torch.arange(len(row) - 1)[None])
        runner.commit_prefix(torch.tensor([len(row) - 1]))
        out.append(runner.forward(torch.tensor([row[-1:]]), torch.tensor([[len(row) - 1]])).logits[0, 0])
    return torch.stack(out)


def test_tree_forward_and_commit_match_sequential_decoding_per_row() -> None:
    target = tiny("qwen2")
    L = target.num_layers
    runner = FastTargetRunner(target, (1, L), max_batch_size=2, max_seq_len=64)
    g = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(0, 384, (11,), generator=g).tolist(),
        torch.randint(0, 384, (7,), generator=g).tolist(),
    ]
    lens = [len(p) for p in prompts]
    runner.reset(2)
    padded = torch.zeros(2, 11, dtype=torch.long)
    for b, p in enumerate(prompts):
        padded[b, : len(p)] = torch.tensor(p)
    runner.forward(padded, torch.arange(11).expand(2, 11))
    runner.commit_prefix(torch.tensor(lens))
    nodes = torch.randint(0, 384, (2, len(PARENT)), generator=g)
    positions = torch.tensor(lens)[:, None] + torch.tensor(DEPTH)[None]
    verify = runner.forward(nodes, positions, tree_mask().expand(2, -1, -1))
    # the tree forward's own logits equal decoding each node's root path
    paths = {i: [] for i in range(len(PARENT))}
    for i in range(len(PARENT)):
        j = i
        while j >= 0:
            paths[i].insert(0, j)
            j = PARENT[j]
    ref = FastTargetRunner(target, (1, L), max_batch_size=1, max_seq_len=64)
    for i, path in paths.items():
        expect = _sequential_logits(ref, [prompts[b] + nodes[b, path].tolist() for b in range(2)])
        torch.testing.assert_close(verify.logits[:, i], expect, atol=ATOL, rtol=0)
    # accept path 0-1-4 in row 0, 0-2 in row 1 (padded with a junk index), then decode one more
    accepted = torch.tensor([[0, 1, 4], [0, 2, 5]])
    runner.commit(accepted, torch.tensor([3, 2]))
    assert runner.lengths.tolist() == [lens[0] + 3, lens[1] + 2]
    nxt = torch.tensor([[5], [9]])
    after = runner.forward(nxt, runner.lengths[:, None]).logits[:, 0]
    expect = _sequential_logits(
        ref,
        [prompts[0] + nodes[0, [0, 1, 4]].tolist() + [5], prompts[1] + nodes[1, [0, 2]].tolist() + [9]],
    )
    torch.testing.assert_close(after, expect, atol=ATOL, rtol=0)


def test_logits_at_picks_each_rows_token() -> None:
    target = tiny("llama")
    runner = FastTargetRunner(target, (), max_batch_size=3, max_seq_len=32)
    runner.reset(3)
    ids = torch.randint(0, 384, (3, 9))
    pos = torch.arange(9).expand(3, 9)
    full = runner.forward(ids, pos)
    at = torch.tensor([8, 0, 4])
    picked = runner.forward(ids, pos, logits_at=at)
    assert picked.logits.shape == (3, 1, target.vocab_size) and picked.aux.shape == (3, 9, 0)
    torch.testing.assert_close(picked.logits[:, 0], full.logits[torch.arange(3), at], atol=ATOL, rtol=0)


def test_kv_bucket_steps_and_capacity() -> None:
    assert [kv_bucket(n, 4096) for n in (1, 64, 65, 512, 513, 4000, 5000)] == [
        64,
        64,
        128,
        512,
        768,
        4096,
        4096,
    ]
    assert kv_bucket(9000, 16384) == 9216


def test_forward_verifies_greedily_when_asked() -> None:
    """forward(..., greedy=True) carries each row's greedy verification of the tree it ran: the
    same path and tokens as verifying its logits afterwards (a tree and the causal chain). Row 0's
    nodes 1 and 3 are set to the target's choice, so its path is 0-1-3 (chain: 0-1-2-3)."""
    from eaglewire.engine.tree import tree_from_parents
    from eaglewire.engine.verify import greedy_path

    target = tiny("llama")
    runner = FastTargetRunner(target, (), max_batch_size=2, max_seq_len=64)
    g = torch.Generator().manual_seed(5)
    runner.reset(2)
    runner.forward(torch.randint(0, 384, (2, 8), generator=g), torch.arange(8).expand(2, 8))
    runner.commit_prefix(torch.tensor([8, 8]))
    chain = list(range(-1, len(PARENT) - 1))
    for parents, mask, agreeing, depths in (
        (PARENT, tree_mask().expand(2, -1, -1), [1, 3], DEPTH),
        (chain, None, [1, 2, 3], list(range(len(PARENT)))),
    ):
        nodes = torch.randint(0, 384, (2, len(PARENT)), generator=g)
        positions = (8 + torch.tensor(depths)).expand(2, -1)
        for i in agreeing:  # a node's logits depend on its ancestors only: fix them in depth order
            nodes[0, i] = runner.forward(nodes, positions, mask).logits[0, parents[i]].argmax()
        fwd = runner.forward(nodes, positions, mask, greedy=True)
        assert fwd.greedy is not None and fwd.greedy.shape == (2, 1 + 2 * len(PARENT))
        assert int(fwd.greedy[0, 0]) == len(agreeing) + 1
        for b in range(2):
            row_tree = tree_from_parents(nodes[b], torch.tensor(parents))
            assert fwd.greedy[b].tolist() == greedy_path(row_tree, fwd.logits[b]).tolist()
