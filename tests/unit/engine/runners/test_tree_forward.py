"""The runners the decoder uses: a tree forward after a committed prefix gives, for every node,
the logits and aux states a plain forward over that node's path gives."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.runners.recompute import RecomputeRunner
from eaglewire.engine.tree import tree_from_parents
from eaglewire.errors import ConfigError
from eaglewire.target.capture import capture
from tests.unit.engine.conftest import RUNNER_KINDS

#        root
#       /    \
#      a      b
#      |
#      c
PARENTS = torch.tensor([-1, 0, 0, 1])


@pytest.mark.parametrize("kind", RUNNER_KINDS)
def test_tree_forward_equals_path_forwards(tiny, kind):
    model = tiny.target.model
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, kind, max_seq_len=64)
    prefix = tiny.prompts[0][:9]
    tokens = torch.tensor([prefix[-1], 40, 41, 42])
    tree = tree_from_parents(tokens, PARENTS)
    runner.reset(1)
    C = len(prefix) - 1
    runner.forward(torch.tensor([prefix[:-1]]), torch.arange(C)[None])
    runner.commit(torch.arange(C)[None], torch.tensor([C]))
    fwd = runner.forward(tokens[None], tree.positions(C)[None], tree.ancestor_mask()[None])
    for node, path in ((0, [0]), (1, [0, 1]), (2, [0, 2]), (3, [0, 1, 3])):
        seq = torch.tensor([prefix[:-1] + tokens[path].tolist()])
        ref = capture(
            model,
            seq,
            aux_boundaries=tiny.contract.aux_boundaries,
            final=tiny.contract.final,
            return_logits=True,
        )
        assert ref.logits is not None
        torch.testing.assert_close(fwd.logits[0, node], ref.logits[0, -1].float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(fwd.aux[0, node], ref.aux[0, -1], rtol=1e-4, atol=1e-4)
    # committing the path root -> a -> c keeps exactly those, in order
    runner.commit(torch.tensor([[0, 1, 3]]), torch.tensor([3]))
    assert int(runner.lengths[0]) == C + 3
    nxt = runner.forward(torch.tensor([[7]]), torch.tensor([[C + 3]]))
    seq = torch.tensor([prefix[:-1] + tokens[[0, 1, 3]].tolist() + [7]])
    ref_logits = model(input_ids=seq, use_cache=False).logits[0, -1]
    torch.testing.assert_close(nxt.logits[0, 0], ref_logits, rtol=1e-4, atol=1e-4)


def test_recompute_runner_rejects_out_of_order_commits(tiny):
    runner = RecomputeRunner(tiny.target, tiny.contract.aux_boundaries)
    runner.reset(1)
    runner.forward(torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 2]]))
    with pytest.raises(ConfigError, match="positions of the accepted tokens"):
        runner.commit(torch.tensor([[0, 2]]), torch.tensor([2]))
