"""The launch-ahead round loop (`engine.pipelined`) against the lockstep loop and plain greedy
decoding: the same tokens, finish reasons and per-round traces, for chains, trees and plain
decoding, untrained and trained drafts, and stops (eos, max_new_tokens, a stop string) inside an
accepted block, where the round launched ahead must be discarded. On CPU in float32: the fast
runtime runs the same code as on a GPU, eagerly (no graphs, no pinned copies)."""

from __future__ import annotations

import functools

import pytest
import torch

from eaglewire.engine import pipelined
from eaglewire.engine.decode_trace import DecodeTrace
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.tree import DeviceRoot
from eaglewire.engine.verify import DeviceVerdict, StopRule
from eaglewire.errors import ConfigError
from tests.unit.engine.conftest import REFERENCE_TOKENS, inside_blocks

SPECS = {"chain": SpecArgs.chain(4), "tree": SpecArgs(num_steps=4, topk=3, num_draft_tokens=8)}
GREEDY = SamplingParams()


def both_loops(tiny, draft, spec, prompt, stop, *, max_seq_len=256) -> tuple[DecodeTrace, DecodeTrace]:
    """(lockstep, launch-ahead) traces on one fast runner, each with a fresh drafter."""
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=max_seq_len)
    traces = {}
    for ahead in (False, True):
        drafter = None if spec is None else Drafter(draft, spec, max_seq_len=max_seq_len)
        traces[ahead] = speculative_generate(
            runner, drafter, prompt, sampling=GREEDY, stop=stop, launch_ahead=ahead
        )
    assert (traces[False].loop, traces[True].loop) == ("lockstep", "launch_ahead")
    return traces[False], traces[True]


def assert_same(lockstep: DecodeTrace, ahead: DecodeTrace) -> None:
    assert ahead.token_ids == lockstep.token_ids
    assert ahead.finish_reason == lockstep.finish_reason
    assert ahead.accepted_per_round == lockstep.accepted_per_round
    assert ahead.emitted_per_round == lockstep.emitted_per_round
    assert ahead.accepted_paths == lockstep.accepted_paths
    assert [len(path) - 1 for path in lockstep.accepted_paths] == lockstep.accepted_per_round
    assert all(path[0] == 0 and path == sorted(path) for path in lockstep.accepted_paths)  # root first


@pytest.mark.parametrize("shape", sorted(SPECS))
@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_same_tokens_and_traces_as_lockstep_and_plain(tiny, trained, shape, which):
    draft = tiny.untrained if which == "untrained" else trained
    taus = []
    for prompt, reference in zip(tiny.prompts, tiny.references, strict=True):
        lockstep, ahead = both_loops(tiny, draft, SPECS[shape], prompt, StopRule(REFERENCE_TOKENS))
        assert ahead.token_ids == reference, f"{shape}/{which}: prompt {prompt[:6]}..."
        assert_same(lockstep, ahead)
        taus.append(sum(ahead.emitted_per_round) / ahead.num_verifications)
    if which == "trained":  # multi-token rounds (deeper paths, padded extends) really ran
        assert sum(taus) / len(taus) > 1.5, taus


def test_plain_decoding_launches_ahead_too(tiny):
    for prompt, reference in zip(tiny.prompts, tiny.references, strict=True):
        lockstep, ahead = both_loops(tiny, None, None, prompt, StopRule(REFERENCE_TOKENS))
        assert ahead.token_ids == reference
        assert_same(lockstep, ahead)
        assert ahead.emitted_per_round == [1] * REFERENCE_TOKENS


@pytest.mark.parametrize("shape", sorted(SPECS))
@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 23])
def test_max_new_tokens_inside_a_round(tiny, trained, shape, max_new_tokens):
    stop = StopRule(max_new_tokens)
    lockstep, ahead = both_loops(tiny, trained, SPECS[shape], tiny.prompts[0], stop)
    assert ahead.token_ids == tiny.references[0][:max_new_tokens]
    assert_same(lockstep, ahead)


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_eos_inside_a_round(tiny, trained, shape):
    prompt, reference = tiny.prompts[0], tiny.references[0]
    free, _ = both_loops(tiny, trained, SPECS[shape], prompt, StopRule(REFERENCE_TOKENS))
    candidates = [k for k in inside_blocks(free) if reference[k] not in reference[:k]]
    assert candidates, f"no new token inside a multi-token round: {free.emitted_per_round}"
    k = candidates[0]
    stop = StopRule(REFERENCE_TOKENS, eos_token_ids=frozenset({reference[k]}))
    lockstep, ahead = both_loops(tiny, trained, SPECS[shape], prompt, stop)
    assert ahead.token_ids == reference[: k + 1] and ahead.finish_reason == "eos"
    assert sum(ahead.emitted_per_round) > len(ahead.token_ids), "the eos ended its round"
    assert_same(lockstep, ahead)


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_stop_string_inside_a_round(tiny, trained, shape):
    prompt, reference = tiny.prompts[0], tiny.references[0]
    tok = tiny.target.tokenizer

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=True))

    free, _ = both_loops(tiny, trained, SPECS[shape], prompt, StopRule(REFERENCE_TOKENS))
    for k in inside_blocks(free):  # a string that first appears when token k is added
        new = decode(reference[: k + 1])
        text = new[-2:]
        if text.strip() and "\ufffd" not in text and text not in decode(reference[:k]):
            stop = StopRule(REFERENCE_TOKENS, stop_strings=(text,), decode=decode)
            lockstep, ahead = both_loops(tiny, trained, SPECS[shape], prompt, stop)
            if lockstep.finish_reason == "stop_string" and len(lockstep.token_ids) == k + 1:
                break
    else:
        pytest.fail(f"no stop string ends inside a round: {free.emitted_per_round}")
    assert ahead.token_ids == reference[: k + 1] and ahead.finish_reason == "stop_string"
    assert sum(ahead.emitted_per_round) > len(ahead.token_ids)
    assert_same(lockstep, ahead)


def test_near_the_end_of_the_cache_it_reads_the_verdict_first(tiny, monkeypatch):
    """Where round k+1 might not fit under the bound, it is launched after round k's verdict is
    read (with the exact count); the cache that suffices for lockstep suffices here."""
    exact = []
    advance = pipelined._advance

    def spy(*args, **kwargs):
        exact.append(kwargs.get("count") is not None)
        return advance(*args, **kwargs)

    monkeypatch.setattr(pipelined, "_advance", spy)
    spec, prompt, new = SPECS["chain"], tiny.prompts[1], 20
    tight = len(prompt) + new + spec.num_draft_tokens  # what SpeculativeDecoder.generate requires
    lockstep, ahead = both_loops(tiny, tiny.untrained, spec, prompt, StopRule(new), max_seq_len=tight)
    assert ahead.token_ids == tiny.references[1][:new]
    assert_same(lockstep, ahead)
    assert any(exact) and not all(exact), exact


def test_dispatch(tiny):
    prompt, stop = tiny.prompts[0], StopRule(4)
    fast = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=256)
    hf = make_runner(tiny.target, tiny.contract.aux_boundaries, "hf")
    sampled = SamplingParams(temperature=0.8)
    gen = torch.Generator().manual_seed(0)

    def run(runner, sampling, **kw):
        drafter = Drafter(tiny.untrained, SPECS["tree"], max_seq_len=256)
        return speculative_generate(
            runner, drafter, prompt, sampling=sampling, stop=stop, verify_generator=gen, **kw
        )

    assert run(fast, GREEDY).loop == "lockstep"  # CPU: nothing to overlap, so auto keeps lockstep
    assert run(fast, GREEDY, launch_ahead=True).loop == "launch_ahead"
    assert run(fast, sampled).loop == "lockstep"  # sampled verification decides on the host
    assert run(hf, GREEDY).loop == "lockstep"  # the recompute runner has no device-side verdict
    assert run(fast, GREEDY, launch_ahead=False).loop == "lockstep"
    for runner, sampling in ((hf, GREEDY), (fast, sampled)):
        with pytest.raises(ConfigError, match="launch_ahead=True"):
            run(runner, sampling, launch_ahead=True)


@pytest.mark.parametrize(
    ("spec", "path", "count"),
    [(SPECS["chain"], [0, 1, 2, 3, 4], 3), (SPECS["tree"], [0, 2, 5, 1, 3], 3), (SPECS["tree"], [0] * 5, 1)],
    ids=["chain", "tree", "root only accepted"],
)
def test_extend_verified_equals_extend(tiny, trained, spec, path, count):
    """Padded rows from a device-side verdict leave the draft as an extend by the real rows does:
    the same committed K/V, then the same tree (same candidates) from the device-side root."""
    torch.manual_seed(0)
    width = len(tiny.contract.aux_boundaries) * tiny.target.hidden_size
    start, N = 20, spec.num_draft_tokens
    prompt_aux, prompt_tokens = torch.randn(start, width), torch.randint(3, 300, (start,))
    node_aux, node_next = torch.randn(N, width), torch.randint(3, 300, (N,))
    P = min(spec.num_steps + 1, N)
    packed = torch.cat([torch.tensor([count]), torch.arange(N), node_next])  # [1 + 2N]
    packed[1 : 1 + P] = torch.tensor(path)
    packed[1 + N : 1 + N + P] = node_next[torch.tensor(path)]
    real = torch.tensor(path[:count])
    bonus = int(node_next[real[-1]])

    lockstep, ahead = (Drafter(trained, spec, max_seq_len=128) for _ in range(2))
    for d in (lockstep, ahead):
        d.extend(prompt_aux, prompt_tokens, start_position=0)
    lockstep.extend(node_aux[real], node_next[real], start_position=start)
    want = lockstep.draft_tree(bonus, start + count, GREEDY)
    ahead.extend_verified(node_aux, DeviceVerdict.of(packed, P), start_position=start)
    assert ahead.committed == start + P  # a host bound from now on
    root = DeviceRoot(torch.tensor([bonus]), torch.tensor([start + count]), position_bound=start + P)
    got = ahead.draft_tree_at(root)
    kept = start + count
    torch.testing.assert_close(ahead.cache.key[:, :, :kept], lockstep.cache.key[:, :, :kept])
    torch.testing.assert_close(ahead.cache.value[:, :, :kept], lockstep.cache.value[:, :, :kept])
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.parents, want.parents)
    assert got.scores is not None and want.scores is not None
    torch.testing.assert_close(got.scores, want.scores)


def test_commit_of_padded_path_slots_and_a_length_bound(tiny):
    """The fast runner: committing P path slots of which a device count are real keeps exactly the
    K/V that committing the real ones does, and a forward given a (loose) length bound returns
    what one without it does."""
    prompt = tiny.prompts[0]
    runners = [
        make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=256) for _ in range(2)
    ]
    tree_mask = torch.ones(1, 6, 6, dtype=torch.bool).tril()
    tree_mask[0, 3:, 1:3] = False  # nodes 3.. branch off the root: path [0, 3, 4] is not a prefix
    L = len(prompt)
    for runner in runners:
        runner.reset(1)
        runner.forward(torch.tensor([prompt]), torch.arange(L)[None])
        runner.commit_prefix(torch.tensor([L]))
        depths = torch.tensor([0, 1, 2, 1, 2, 3])
        runner.forward(torch.tensor([[5, 6, 7, 8, 9, 10]]), (depths + L)[None], tree_mask)
    runners[0].commit(torch.tensor([[0, 3, 4]]), torch.tensor([3]))
    runners[1].commit(torch.tensor([[0, 3, 4, 1, 2]]), torch.tensor([3]).to(runners[1].device))
    n = L + 3
    assert int(runners[0].lengths[0]) == int(runners[1].lengths[0]) == n
    assert torch.equal(runners[0].cache.kv[:, :1, :, :n], runners[1].cache.kv[:, :1, :, :n])
    step = (torch.tensor([[11]]), torch.tensor([[n]]), torch.ones(1, 1, 1, dtype=torch.bool))
    plain = runners[0].forward(*step, greedy=True)
    bounded = runners[1].forward(*step, greedy=True, length_bound=n + 5)
    assert plain.greedy is not None and bounded.greedy is not None
    assert torch.equal(plain.greedy, bounded.greedy)
    torch.testing.assert_close(plain.logits, bounded.logits, rtol=0, atol=0)


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_host_bounds_hold_and_are_tight(tiny, trained, shape):
    """Every launch-ahead forward's length bound is >= the true committed length (the window covers
    it) and exceeds it by less than one round's path; a round that certainly ends the generation
    (max_new_tokens) launches nothing after it."""
    spec = SPECS[shape]
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=256)
    slack: list[int] = []
    forward = runner.forward

    @functools.wraps(forward)
    def checked(*args, **kwargs):
        bound = kwargs.get("length_bound")
        if bound is not None:
            slack.append(bound - int(runner.lengths[0]))  # CPU: reading the lengths is free
        return forward(*args, **kwargs)

    runner.forward = checked
    for max_new_tokens in (1, REFERENCE_TOKENS):
        slack.clear()
        drafter = Drafter(trained, spec, max_seq_len=256)
        stop = StopRule(max_new_tokens)
        trace = speculative_generate(
            runner, drafter, tiny.prompts[0], sampling=GREEDY, stop=stop, launch_ahead=True
        )
        assert trace.loop == "launch_ahead"
        assert all(0 <= s < spec.num_steps + 1 for s in slack), slack
        assert len(slack) - trace.num_verifications <= 1  # at most the one round launched ahead
        if max_new_tokens == 1:
            assert len(slack) == trace.num_verifications == 1
        else:
            assert max(slack) > 0  # rounds really were launched before their root was known
