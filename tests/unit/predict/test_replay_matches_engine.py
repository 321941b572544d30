"""The offline replay (`eaglewire eval`'s predicted tau) equals the engine, round for round, on the
engine's own text.

The engine decodes greedily after a prompt (float32, CPU, a chain of N drafts, both round loops);
the held-out record is that prompt + the generated text (loss mask on the generated tokens), and
the evaluation runs the code `eaglewire eval` runs (`evaluate_draft` with the online target side)
with the replay's horizon = the number of generated tokens. The text is the target's greedy output,
so the target's argmax at every position is the next text token and "accepted" means the same on
both sides: every round's accepted count, and so tau and the per-position acceptance, must agree.

Two record ends:
  * the record goes on past the horizon (plain greedy tokens beyond the engine's): the replay
    equals the engine exactly, the last round included;
  * the record is exactly prompt + generated: a last round whose drafts run past the text's end is
    cut there (the engine verifies drafts past max_new_tokens; the record has no labels there).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from eaglewire.contract.contract import Contract
from eaglewire.data.types import TokenizedRecord
from eaglewire.draft.init import init_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.decode_trace import DecodeTrace
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.verify import StopRule
from eaglewire.predict.evaluation import EvalResult, evaluate_draft
from eaglewire.predict.replay import accepted_drafts, chain_tree, response_spans
from eaglewire.predict.served import rounds_within_text
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from eaglewire.train.target_side import OnlineTarget
from tests.helpers.tiny import CORPUS, make_tiny_target
from tests.unit.engine.conftest import Tiny, chat_ids, plain_greedy, train_draft

ARCHS = ("llama", "qwen3")
STEPS = 4  # draft steps evaluated: the longest chain
CHAINS = (STEPS, 2)  # chain lengths decoded (each replayed from the same evaluation)
NEW_TOKENS = 40  # max_new_tokens of the engine = the replay's horizon
MAX_SEQ_LEN = 256
DRAFTS = ("untrained", "trained", "trained_partial_vocab")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class Setup:
    target: LoadedTarget
    contract: Contract
    drafts: dict[str, Eagle3Draft]
    prompts: list[list[int]]
    greedy: list[list[int]]  # NEW_TOKENS + STEPS + 1 plain greedy tokens after each prompt


def partial_vocab(
    target: LoadedTarget, contract: Contract, trained: Eagle3Draft, text: list[int]
) -> Eagle3Draft:
    """`trained` with a draft vocabulary that lacks the three tokens the greedy text uses most: the
    engine can never draft them, the evaluation must count them as rejected (out of vocabulary)."""
    counts = torch.bincount(torch.tensor(text), minlength=target.vocab_size)
    dropped = counts.argsort(descending=True)[:3]
    keep = torch.ones(target.vocab_size, dtype=torch.bool)
    keep[dropped] = False
    d2t = keep.nonzero().squeeze(1)
    draft = init_draft(target, contract, draft_to_target=d2t, seed=1)
    state = {k: v for k, v in trained.state_dict().items() if k not in ("lm_head.weight", "draft_to_target")}
    draft.load_state_dict({**state, "lm_head.weight": trained.lm_head.weight[d2t]}, strict=False)
    return draft.eval().requires_grad_(False)


@pytest.fixture(scope="module", params=ARCHS)
def setup(request) -> Setup:
    target = make_tiny_target(request.param, num_layers=4)
    contract = build_contract(target, (1, 2, 3))
    prompts = [chat_ids(target, text) for text in CORPUS[:3]]
    greedy = [plain_greedy(target.model, p, NEW_TOKENS + STEPS + 1) for p in prompts]
    untrained = init_draft(target, contract).eval()
    # trained on the target's greedy text after these prompts (the engine tests' recipe)
    trained = train_draft(Tiny(target, contract, untrained, prompts, [g[:NEW_TOKENS] for g in greedy]))
    drafts = {
        "untrained": untrained,
        "trained": trained,
        "trained_partial_vocab": partial_vocab(target, contract, trained, [t for g in greedy for t in g]),
    }
    return Setup(target, contract, drafts, prompts, greedy)


def decode(
    setup: Setup, draft: Eagle3Draft, prompt: list[int], chain: int, launch_ahead: bool
) -> DecodeTrace:
    runner = make_runner(setup.target, setup.contract.aux_boundaries, "fast", max_seq_len=MAX_SEQ_LEN)
    drafter = Drafter(draft, SpecArgs.chain(chain), max_seq_len=MAX_SEQ_LEN)
    trace = speculative_generate(
        runner,
        drafter,
        prompt,
        sampling=SamplingParams(),
        stop=StopRule(NEW_TOKENS),
        launch_ahead=launch_ahead,
    )
    assert trace.loop == ("launch_ahead" if launch_ahead else "lockstep")
    return trace


def evaluate(setup: Setup, draft: Eagle3Draft, prompt: list[int], text: list[int]) -> EvalResult:
    """`eaglewire eval`'s evaluation of one record, prompt + text, replayed over NEW_TOKENS tokens."""
    ids = torch.tensor(prompt + text)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    mask[len(prompt) :] = True
    # the text is the target's greedy output: its argmax at every position is the next text token
    with torch.no_grad():
        argmax = setup.target.model(input_ids=ids[None]).logits[0].argmax(-1)
    assert argmax[len(prompt) - 1 : -1].tolist() == text
    side = OnlineTarget(setup.target, setup.contract, draft.draft_to_target)
    record = TokenizedRecord("engine-text", ids, mask)
    result = evaluate_draft(draft, setup.contract, side, [record], num_steps=STEPS, max_length=len(ids))
    return replace(result, horizon=NEW_TOKENS)


def check_replay(result: EvalResult, trace: DecodeTrace, chain: int, text_tokens: int) -> None:
    # the engine's accepted drafts per round, each cut at the end of the record's text (the bench's rule)
    rounds = rounds_within_text(trace.accepted_per_round, trace.emitted_per_round, text_tokens)
    # round by round: the rows where the engine's rounds start accept what the engine accepted
    accepted = accepted_drafts(result.ranks, result.valid, chain_tree(chain))
    ((first, end),) = response_spans(result.valid[:, 0], result.segments or (int(result.ranks.shape[0]),))
    starts = [first + sum(trace.emitted_per_round[:k]) for k in range(len(rounds))]
    assert max(starts) < end
    assert [int(accepted[t]) for t in starts] == rounds
    # and the replay walks exactly those rounds: count, tokens, tau, per-position acceptance
    replay = result.replay_chain(chain)
    assert replay.rounds == len(rounds)
    assert replay.tokens == sum(n + 1 for n in rounds)
    assert replay.tau == pytest.approx(replay.tokens / len(rounds), abs=0, rel=1e-12)
    per_position = [sum(n >= j for n in rounds) / len(rounds) for j in range(1, chain + 1)]
    assert replay.per_position_acceptance == pytest.approx(per_position, abs=1e-12)


@pytest.mark.parametrize("which", DRAFTS)
def test_replay_equals_engine_rounds(setup: Setup, which: str):
    draft = setup.drafts[which]
    total_accepted = oov = 0
    for prompt, greedy in zip(setup.prompts, setup.greedy, strict=True):
        traces = {
            (chain, ahead): decode(setup, draft, prompt, chain, ahead)
            for chain in CHAINS
            for ahead in (False, True)
        }
        for (chain, ahead), trace in traces.items():
            assert trace.token_ids == greedy[:NEW_TOKENS], f"chain {chain} launch_ahead={ahead}: not lossless"
            lockstep = traces[(chain, False)]
            assert (trace.accepted_per_round, trace.emitted_per_round) == (
                lockstep.accepted_per_round,
                lockstep.emitted_per_round,
            )
        # the record goes on past the horizon: exact, the last round included
        longer = evaluate(setup, draft, prompt, greedy)
        # the record is exactly prompt + generated text: a last round past its end is cut there
        exact = evaluate(setup, draft, prompt, greedy[:NEW_TOKENS])
        oov += int(longer.summary()["oov_masked"])
        for chain in CHAINS:
            trace = traces[(chain, False)]
            assert sum(trace.emitted_per_round) <= len(greedy)  # the longer record covers every draft
            check_replay(longer, trace, chain, len(greedy))
            check_replay(exact, trace, chain, NEW_TOKENS)
            total_accepted += sum(trace.accepted_per_round)
    assert (oov > 0) == (which == "trained_partial_vocab")  # text tokens the draft cannot draft
    if which == "untrained":
        return
    # trained drafts are accepted often, deeper than one draft too (the replay is tested on real rounds)
    assert total_accepted >= 60
