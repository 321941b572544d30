"""Speculative greedy == plain greedy, token for token: chain and tree, untrained and trained
drafts, several prompts and lengths, on the recompute runner and the fast runtime."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.verify import StopRule
from tests.unit.engine.conftest import REFERENCE_TOKENS, RUNNER_KINDS, inside_blocks, train_draft

SPECS = {"chain": SpecArgs.chain(4), "tree": SpecArgs(num_steps=4, topk=3, num_draft_tokens=8)}


def decoder(tiny, draft, spec, kind):
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, kind, max_seq_len=256)
    return SpeculativeDecoder(runner, draft, spec, tokenizer=tiny.target.tokenizer)


@pytest.mark.parametrize("kind", RUNNER_KINDS)
@pytest.mark.parametrize("shape", sorted(SPECS))
@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_greedy_equals_plain(tiny, trained, kind, shape, which):
    draft = tiny.untrained if which == "untrained" else trained
    dec = decoder(tiny, draft, SPECS[shape], kind)
    taus = []
    for prompt, reference in zip(tiny.prompts, tiny.references, strict=True):
        result = dec.generate(prompt, max_new_tokens=REFERENCE_TOKENS)
        assert result.token_ids == reference, f"{kind}/{shape}/{which}: prompt {prompt[:6]}..."
        assert result.finish_reason == "max_new_tokens"
        taus.append(result.tau)
    mean_tau = sum(taus) / len(taus)
    if which == "trained":
        # the acceptance paths (multi-token blocks, deeper tree nodes) really ran
        assert mean_tau > 1.5, taus
    else:
        assert mean_tau >= 1.0


def test_a_draft_with_more_attention_heads_than_the_target_decodes_losslessly(tiny):
    """The drafter sizes its KV cache and attention from the draft's own config, not the target's."""
    heads = 2 * tiny.target.config.num_attention_heads
    draft = train_draft(tiny, num_attention_heads=heads)
    assert (draft.config.num_attention_heads, draft.config.num_key_value_heads) == (
        heads,
        2 * tiny.target.config.num_key_value_heads,
    )
    for kind in RUNNER_KINDS:
        for shape, spec in SPECS.items():
            dec = decoder(tiny, draft, spec, kind)
            taus = []
            for prompt, reference in zip(tiny.prompts, tiny.references, strict=True):
                result = dec.generate(prompt, max_new_tokens=REFERENCE_TOKENS)
                assert result.token_ids == reference, f"{kind}/{shape}: prompt {prompt[:6]}..."
                taus.append(result.tau)
            assert sum(taus) / len(taus) > 1.5, (kind, shape, taus)  # drafted tokens were accepted


@pytest.mark.parametrize("kind", RUNNER_KINDS)
@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 23])
def test_lengths_stop_inside_blocks(tiny, trained, kind, max_new_tokens):
    dec = decoder(tiny, trained, SPECS["tree"], kind)
    result = dec.generate(tiny.prompts[0], max_new_tokens=max_new_tokens)
    assert result.token_ids == tiny.references[0][:max_new_tokens]


def test_plain_mode_is_plain(tiny):
    dec = decoder(tiny, tiny.untrained, SPECS["chain"], "hf")
    result = dec.generate(tiny.prompts[1], max_new_tokens=12, use_draft=False)
    assert result.token_ids == tiny.references[1][:12]
    assert result.tau == 1.0 and result.num_verifications == 12


def test_eos_inside_an_accepted_block_stops_there(tiny, trained):
    spec = SPECS["chain"]
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "hf")
    prompt, reference = tiny.prompts[0], tiny.references[0]
    greedy = SamplingParams()
    free = speculative_generate(
        runner, Drafter(trained, spec), prompt, sampling=greedy, stop=StopRule(REFERENCE_TOKENS)
    )
    # A position that sits inside a multi-token block (not its last token), whose token is new.
    candidates = [k for k in inside_blocks(free) if reference[k] not in reference[:k]]
    assert candidates, f"no block with >= 2 tokens: {free.emitted_per_round}"
    k = candidates[0]
    eos = reference[k]

    trace = speculative_generate(
        runner,
        Drafter(trained, spec),
        prompt,
        sampling=greedy,
        stop=StopRule(REFERENCE_TOKENS, eos_token_ids=frozenset({eos})),
    )
    assert trace.token_ids == reference[: k + 1]
    assert trace.finish_reason == "eos"
    assert sum(trace.emitted_per_round) > len(trace.token_ids), "the eos was the bonus, not inside a block"


def test_runner_capacity_is_checked(tiny):
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "auto", max_seq_len=32)
    dec = SpeculativeDecoder(runner, tiny.untrained, SPECS["chain"])
    if getattr(runner, "max_seq_len", None) is None:
        pytest.skip("this runner has no fixed capacity")
    with pytest.raises(ValueError, match="max_seq_len=32"):
        dec.generate(list(range(3, 23)), max_new_tokens=20)


def test_trained_draft_is_better_than_untrained(tiny, trained):
    """Guards the fixture: the trained-like draft must really agree with the target."""
    prompt = tiny.prompts[2]
    taus = {}
    for name, draft in (("untrained", tiny.untrained), ("trained", trained)):
        taus[name] = decoder(tiny, draft, SPECS["chain"], "hf").generate(prompt, max_new_tokens=24).tau
    assert taus["trained"] > taus["untrained"] + 0.5, taus
    assert torch.isfinite(torch.tensor(list(taus.values()))).all()


def test_a_tree_wider_than_the_graphed_width_is_reserved_and_lossless(tiny, trained):
    """A tree of more nodes than the fast runner graphs by default (128) makes the decoder widen
    the runner's graphed width before its first verify (on CUDA those forwards then replay a graph
    instead of running eagerly, tests/gpu/test_wide_tree_graphs_cuda.py); the text stays plain's."""
    if "fast" not in RUNNER_KINDS:
        pytest.skip("the fast runtime is not installed")
    wide = SpecArgs(num_steps=6, topk=8, num_draft_tokens=160)
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=512)
    assert runner.graph_max_new_tokens < wide.num_draft_tokens  # the default this test is about
    dec = SpeculativeDecoder(runner, trained, wide, tokenizer=tiny.target.tokenizer)
    result = dec.generate(tiny.prompts[0], max_new_tokens=REFERENCE_TOKENS)
    assert result.token_ids == tiny.references[0]
    assert runner.graph_max_new_tokens == wide.num_draft_tokens
