"""Speculative sampling preserves the target's distribution end to end: the first generated token
(which comes out of the first verification) over many seeds, chain and tree, on a target with a
tiny vocabulary (no tokenizer), against the target's processed (temperature, top-p) distribution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from eaglewire.draft.init import init_draft
from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams, probs_from_logits
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import tiny_config
from tests.unit.engine.stats import chi_square, detectable

VOCAB = 24
LOGIT_SCALE = 6.0  # makes the random target's next-token distribution uneven (entropy ~ 2.3 nats)
PROMPT = [5, 9, 3, 17, 2, 11]
SAMPLES = 700
ALPHA = 1e-3


@pytest.fixture(scope="module")
def small_vocab():
    torch.manual_seed(0)
    cfg = tiny_config("llama", vocab_size=VOCAB, num_layers=2)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    target = LoadedTarget(model=model, tokenizer=None, path=Path("<tiny-vocab>"))
    contract = build_contract(target, [0, 1, 2])
    return target, contract, init_draft(target, contract).eval()


@pytest.mark.parametrize(
    ("spec", "sampling"),
    [
        (SpecArgs.chain(2), SamplingParams(temperature=0.8, top_p=0.9)),
        (SpecArgs(num_steps=2, topk=3, num_draft_tokens=6), SamplingParams(temperature=1.0, top_p=0.95)),
    ],
    ids=["chain", "tree"],
)
def test_first_token_follows_the_target(small_vocab, spec, sampling):
    target, contract, draft = small_vocab
    runner = make_runner(target, contract.aux_boundaries, "auto", max_seq_len=32)
    decoder = SpeculativeDecoder(runner, draft, spec)
    with torch.no_grad():
        logits = target.model(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    target_probs = probs_from_logits(logits, sampling)
    assert int((target_probs > 0).sum()) < VOCAB  # top-p removed tokens: never drawing them is checked too

    counts = torch.zeros(VOCAB)
    accepted = 0
    for seed in range(SAMPLES):
        params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, seed=seed)
        result = decoder.generate(PROMPT, max_new_tokens=1, sampling=params)
        counts[result.token_ids[0]] += 1
        accepted += result.tau > 1  # the first verification accepted at least one draft
    rate = accepted / SAMPLES
    assert 0.05 < rate < 0.95, (
        f"acceptance rate {rate}: both branches must run for the test to mean something"
    )
    stat, df, p = chi_square(counts, target_probs)
    assert p > ALPHA, f"first-token distribution differs from the target's: chi2={stat:.1f} df={df} p={p:.2e}"

    # Power: a verifier that accepted every draft would emit the draft's own first choice (a draw
    # from its processed distribution for a chain, its top candidate for a tree); that must fail.
    states = capture(
        target.model,
        torch.tensor([PROMPT[:-1]]),
        aux_boundaries=contract.aux_boundaries,
        final=contract.final,
    )
    drafter = Drafter(draft, spec)
    drafter.extend(states.aux[0], torch.tensor(PROMPT[1:]), start_position=0)
    assert drafter.last_logits is not None
    if spec.is_chain:
        accept_all = probs_from_logits(drafter.last_logits, sampling)
    else:
        accept_all = torch.nn.functional.one_hot(drafter.last_logits.argmax(), VOCAB).float()
    assert detectable(target_probs, accept_all, SAMPLES, ALPHA)
