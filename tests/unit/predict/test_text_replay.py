"""The text replay (`predict.text_replay`) runs the engine's own dynamic-tree rounds without the
target: on the target's greedy text (float32, CPU) it finds the same accepted drafts, round for
round, as the real engine verifying with the target, for a chain and for trees."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.predict.text_replay import TextRunner, replay_on_texts, text_aux
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import CORPUS, make_tiny_target
from tests.unit.engine.conftest import AUX_BOUNDARIES, NUM_LAYERS, Tiny, chat_ids, plain_greedy, train_draft

TOKENS = 30


@pytest.fixture(scope="module")
def setup() -> tuple[Tiny, torch.nn.Module, list[tuple[list[int], list[int]]]]:
    target = make_tiny_target("llama", num_layers=NUM_LAYERS)
    contract = build_contract(target, AUX_BOUNDARIES)
    from eaglewire.draft.init import init_draft

    prompts = [chat_ids(target, text) for text in CORPUS[:3]]
    # the texts run past what is decoded, so the replay knows each last round's drafts too
    references = [plain_greedy(target.model, p, TOKENS + 12) for p in prompts]
    tiny = Tiny(target, contract, init_draft(target, contract).eval(), prompts, references)
    return tiny, train_draft(tiny).eval(), list(zip(prompts, references, strict=True))


@pytest.mark.parametrize(
    "spec", [SpecArgs.chain(3), SpecArgs(num_steps=3, topk=2, num_draft_tokens=6), SpecArgs(4, 3, 10)],
    ids=["chain3", "tree3x2x6", "tree4x3x10"],
)  # fmt: skip
def test_the_replay_finds_the_engines_rounds(setup, spec: SpecArgs) -> None:  # type: ignore[no-untyped-def]
    tiny, draft, texts = setup
    engine_rounds: list[int] = []
    emitted = 0
    for prompt, generated in texts:
        runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "hf")
        result = SpeculativeDecoder(runner, draft, spec).generate(prompt, max_new_tokens=TOKENS)
        assert result.token_ids == generated[:TOKENS]
        engine_rounds += result.accepted_per_round
        emitted += sum(result.emitted_per_round)
    auxes = [text_aux(tiny.target, tiny.contract, [*p, *g]) for p, g in texts]
    replay = replay_on_texts(draft, spec, texts, auxes, vocab_size=tiny.target.vocab_size,
                             num_layers=tiny.target.num_layers, max_new_tokens=TOKENS)  # fmt: skip
    assert list(replay.accepted_per_round) == engine_rounds
    assert replay.tau == pytest.approx(emitted / len(engine_rounds))
    assert max(engine_rounds) >= 2  # multi-token acceptances really happened


def test_aux_rows_that_do_not_match_the_text_and_batches_are_refused(setup) -> None:  # type: ignore[no-untyped-def]
    tiny, _, texts = setup
    prompt, generated = texts[0]
    ids = torch.tensor([*prompt, *generated])
    aux = text_aux(tiny.target, tiny.contract, ids.tolist())
    runner = TextRunner(vocab_size=tiny.target.vocab_size, num_layers=NUM_LAYERS, device=aux.device,
                        dtype=aux.dtype, max_seq_len=len(ids))  # fmt: skip
    with pytest.raises(ValueError, match="aux rows"):
        runner.set_text(ids, aux[:-1])
    with pytest.raises(ConfigError, match="max_seq_len"):
        runner.set_text(torch.cat([ids, ids[:1]]), torch.cat([aux, aux[:1]]))
    with pytest.raises(ConfigError, match="one text"):
        runner.reset(2)
