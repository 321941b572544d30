"""The drafter's cached, masked tree drafting equals a brute-force EAGLE-2 expansion that
recomputes every path from scratch with plain causal attention (no cache, no tree mask)."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.draft_cache import DraftCache
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.fast.kv_cache import prefill_width
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.target.capture import capture


def draft_path_logits(draft, aux, tokens, path_tokens, root_position):
    """Logits of the last row after feeding committed rows (aux, tokens) and then `path_tokens`,
    each path row taking the previous row's output hidden: full recomputation, causal."""
    n = tokens.shape[0]
    hidden = draft.project(aux[None])  # [1, n, H]
    ids = tokens[None]
    out = draft(ids, hidden, torch.arange(n)[None])
    for j, token in enumerate(path_tokens):
        hidden = torch.cat([hidden, out.hidden[:, -1:]], dim=1)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        positions = torch.cat([torch.arange(n), torch.arange(root_position, root_position + j + 1)])[None]
        out = draft(ids, hidden, positions)
    return out.logits[0, -1]


def brute_force_tree(draft, aux, tokens, spec, root_position):
    """(tokens, parents) of the EAGLE-2 tree, by the definition (SGLang's beam expansion)."""
    K = spec.topk
    cands = []  # (target token, parent candidate index or -1, score, path of tokens)

    def expand(parent_index, path, score):
        logp = torch.log_softmax(draft_path_logits(draft, aux, tokens, path, root_position).float(), -1)
        top = logp.topk(K)
        return [
            (
                int(draft.draft_to_target[i]),
                parent_index,
                score + float(v),
                [*path, int(draft.draft_to_target[i])],
            )
            for v, i in zip(top.values, top.indices, strict=True)
        ]

    frontier = expand(-1, [], 0.0)
    cands += frontier
    frontier_idx = list(range(len(cands)))
    for _ in range(1, spec.num_steps):
        children = []
        for idx in frontier_idx:
            _, _, score, path = cands[idx]
            children += expand(idx, path, score)
        start = len(cands)
        cands += children
        order = sorted(range(len(children)), key=lambda c: (-children[c][2], c))[:K]
        frontier_idx = [start + c for c in order]
    keep = sorted(sorted(range(len(cands)), key=lambda c: (-cands[c][2], c))[: spec.num_draft_tokens - 1])
    node_of = {c: j + 1 for j, c in enumerate(keep)}
    parents = [-1] + [0 if cands[c][1] < 0 else node_of[cands[c][1]] for c in keep]
    return [cands[c][0] for c in keep], parents, [0.0] + [cands[c][2] for c in keep]


@pytest.fixture(scope="module")
def rows(tiny):
    prompt = tiny.prompts[0]
    states = capture(
        tiny.target.model,
        torch.tensor([prompt[:-1]]),
        aux_boundaries=tiny.contract.aux_boundaries,
        final=tiny.contract.final,
    )
    return states.aux[0], torch.tensor(prompt[1:]), prompt[-1], len(prompt) - 1


# (3, 2, 11) and (3, 3, 22) keep every candidate (deep nodes included); (3, 2, 6) reranks.
@pytest.mark.parametrize(
    "spec", [SpecArgs.chain(3), SpecArgs(3, 2, 6), SpecArgs(3, 2, 11), SpecArgs(3, 3, 22)], ids=str
)
@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_tree_drafting_matches_brute_force(tiny, trained, rows, spec, which):
    draft = tiny.untrained if which == "untrained" else trained
    aux, tokens, root, root_position = rows
    drafter = Drafter(draft, spec)
    # Drafting twice from the same state: the provisional tree rows of the first call must not leak.
    for _ in range(2):
        drafter.reset()
        drafter.extend(aux, tokens, start_position=0)
        tree = drafter.draft_tree(root, root_position, SamplingParams())
    with torch.no_grad():
        want_tokens, want_parents, want_scores = brute_force_tree(draft, aux, tokens, spec, root_position)
    assert tree.tokens.tolist() == [root, *want_tokens]
    assert tree.parents.tolist() == want_parents
    # scores pin positions and masks numerically (top-k tokens alone barely move when a position is off)
    assert tree.scores is not None
    torch.testing.assert_close(tree.scores, torch.tensor(want_scores), rtol=0, atol=2e-5)
    assert tree.num_nodes == spec.num_draft_tokens
    assert int(tree.depths.max()) <= spec.num_steps
    for kids in tree.children():  # siblings are distinct tokens
        assert len({int(tree.tokens[k]) for k in kids}) == len(kids)


def test_extend_after_a_round_equals_one_long_extend(tiny, trained, rows):
    """Committed rows fed in two pieces (with a tree drafted in between) give the same state."""
    aux, tokens, root, root_position = rows
    spec = SpecArgs(3, 2, 6)
    split = tokens.shape[0] - 3
    pieces = Drafter(trained, spec)
    pieces.extend(aux[:split], tokens[:split], start_position=0)
    pieces.draft_tree(int(tokens[split - 1]), split, SamplingParams())  # provisional rows, then dropped
    pieces.extend(aux[split:], tokens[split:], start_position=split)
    whole = Drafter(trained, spec)
    whole.extend(aux, tokens, start_position=0)
    assert pieces.last_logits is not None and whole.last_logits is not None
    torch.testing.assert_close(pieces.last_logits, whole.last_logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="contiguous"):
        whole.extend(aux[:1], tokens[:1], start_position=3)


def test_sampled_chain_records_its_draft_distribution(tiny, rows):
    aux, tokens, root, root_position = rows
    drafter = Drafter(tiny.untrained, SpecArgs.chain(3))
    drafter.extend(aux, tokens, start_position=0)
    g = torch.Generator().manual_seed(0)
    tree = drafter.draft_tree(root, root_position, SamplingParams(temperature=0.7, top_p=0.9), g)
    assert tree.draft_probs is not None and tree.draft_probs.shape == (4, tiny.target.vocab_size)
    torch.testing.assert_close(tree.draft_probs[1:].sum(-1), torch.ones(3))
    for node in range(1, 4):  # each token was drawn from its recorded distribution
        assert tree.draft_probs[node, int(tree.tokens[node])] > 0
    assert tree.parents.tolist() == [-1, 0, 1, 2]


def test_draft_cache_writes_at_slots_and_grows_keeping_rows():
    cache = DraftCache(2, 4, dtype=torch.float32, device=torch.device("cpu"), capacity=8)
    k = torch.randn(1, 2, 12, 4)
    cache.write(torch.arange(6), window=6)
    keys, _ = cache.append(k[:, :, :6], k[:, :, :6])
    torch.testing.assert_close(keys, k[:, :, :6])
    assert not cache.ensure(8) and cache.ensure(12) and cache.capacity == 16  # doubles
    cache.write(torch.arange(6, 12), window=12)
    keys, values = cache.append(k[:, :, 6:], k[:, :, 6:])
    torch.testing.assert_close(keys, k)  # rows written before growing survived it
    cache.write(torch.tensor([3]), window=4)  # a provisional row is overwritten in place
    keys, _ = cache.append(k[:, :, :1], k[:, :, :1])
    assert keys.shape[2] == 4 and torch.equal(keys[:, :, 3], k[:, :, 0])


def test_drafter_grows_its_cache_past_the_initial_capacity(tiny, trained, rows):
    """A drafter built for a short sequence still drafts correctly when rows outgrow it."""
    aux, tokens, root, root_position = rows
    spec = SpecArgs(3, 2, 6)
    small = Drafter(trained, spec, max_seq_len=1)
    big = Drafter(trained, spec, max_seq_len=4096)
    trees = []
    for drafter in (small, big):
        drafter.extend(aux, tokens, start_position=0)
        trees.append(drafter.draft_tree(root, root_position, SamplingParams()))
    assert small.cache.capacity >= tokens.shape[0] + small.tree_rows
    assert trees[0].tokens.tolist() == trees[1].tokens.tolist()
    torch.testing.assert_close(trees[0].scores, trees[1].scores)


def test_a_padded_prompt_extend_drafts_the_same_tree(tiny, trained, rows):
    """With graphs on, a prompt-long extend runs padded to a power-of-two width (its graph's): the
    padding rows must change nothing. Here the padded work runs eagerly, as the graph would."""
    aux, tokens, root, root_position = rows
    spec = SpecArgs(3, 2, 6)
    trees = []
    for padded in (False, True):
        drafter = Drafter(trained, spec)
        if padded:  # what a CUDA drafter decides, and its graph's work run directly
            drafter._extend_width = prefill_width  # type: ignore[method-assign]
            drafter._replay = lambda key, make_inputs, fn, values: fn(values)  # type: ignore[method-assign]
        drafter.extend(aux, tokens, start_position=0)
        assert drafter.committed == tokens.shape[0]
        trees.append((drafter.last_logits, drafter.draft_tree(root, root_position, SamplingParams())))
    (plain_logits, plain_tree), (padded_logits, padded_tree) = trees
    assert prefill_width(tokens.shape[0]) > tokens.shape[0]  # the test pads at all
    torch.testing.assert_close(padded_logits, plain_logits, rtol=0, atol=1e-5)
    assert padded_tree.tokens.tolist() == plain_tree.tokens.tolist()
    assert padded_tree.scores is not None and plain_tree.scores is not None
    torch.testing.assert_close(padded_tree.scores, plain_tree.scores, rtol=0, atol=1e-5)
