"""The engine's per-round callback that streaming and cancellation stand on, in both round loops."""

from __future__ import annotations

import pytest

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.runners.protocol import can_launch_ahead
from eaglewire.engine.sampling import SamplingParams, make_generator
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.verify import StopRule
from tests.helpers.tiny import CORPUS
from tests.unit.serve.world import SPEC, World


@pytest.fixture(scope="module")
def decoder(world: World) -> SpeculativeDecoder:
    return SpeculativeDecoder.load(str(world.target_dir), world.draft_dir, spec=SPEC, dtype="float32")


@pytest.mark.parametrize("launch_ahead", [False, True], ids=["lockstep", "launch-ahead"])
def test_rounds_stream_the_tokens_and_can_stop(decoder: SpeculativeDecoder, launch_ahead: bool) -> None:
    if launch_ahead and not can_launch_ahead(decoder.runner):
        pytest.skip("the fast runtime is not available")
    prompt = decoder.encode(CORPUS[1])

    def run(on_round: object) -> object:
        return speculative_generate(
            decoder.runner,
            decoder.drafter,
            prompt,
            sampling=SamplingParams(),
            stop=StopRule(40, decoder.eos_token_ids),
            verify_generator=make_generator(SamplingParams()),
            launch_ahead=launch_ahead,
            on_round=on_round,  # type: ignore[arg-type]
        )

    rounds: list[list[int]] = []
    whole = run(lambda kept: rounds.append(list(kept)) is None)
    assert [t for r in rounds for t in r] == whole.token_ids  # type: ignore[attr-defined]
    assert len(rounds) == whole.num_verifications  # type: ignore[attr-defined]

    seen: list[list[int]] = []
    cut = run(lambda kept: seen.append(list(kept)) is None and len(seen) < 2)
    assert cut.finish_reason == "cancelled" and cut.num_verifications == 2  # type: ignore[attr-defined]
    assert cut.token_ids == whole.token_ids[: len(cut.token_ids)]  # type: ignore[attr-defined]


def test_generate_passes_the_callback_and_keeps_its_result(decoder: SpeculativeDecoder) -> None:
    plain = decoder.generate(CORPUS[0], max_new_tokens=24)
    calls: list[int] = []
    streamed = decoder.generate(
        CORPUS[0], max_new_tokens=24, on_round=lambda kept: calls.append(len(kept)) is None
    )
    assert streamed.token_ids == plain.token_ids and streamed.text == plain.text
    assert sum(calls) == len(plain.token_ids) and len(calls) == plain.num_verifications
    stopped = decoder.generate(CORPUS[0], max_new_tokens=24, on_round=lambda kept: False)
    assert stopped.finish_reason == "cancelled" and stopped.num_verifications == 1
