"""On CUDA with CUDA graphs (target and draft, compiled as by default), the launch-ahead round loop
gives the lockstep loop's tokens and per-round traces, and plain greedy's tokens (float32), also when
an eos inside an accepted block leaves the round launched ahead to be discarded.

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.decode_trace import DecodeTrace
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.verify import StopRule
from tests.gpu.conftest import SPECS, TOKENS, tiny_on_cuda
from tests.unit.engine.conftest import Tiny, inside_blocks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def cuda_tiny() -> tuple[Tiny, torch.nn.Module]:
    return tiny_on_cuda(TOKENS, [[17]])


def run_both(tiny, trained, spec, prompts, stop) -> list[tuple[DecodeTrace, DecodeTrace]]:
    """(lockstep, launch-ahead) per prompt, one graphed runner and one graphed drafter per loop."""
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=256)
    assert getattr(runner, "use_graphs", False), "the fast runtime should replay CUDA graphs on CUDA"
    # the default on CUDA: decode steps through the Triton attention kernel, trees through SDPA
    assert runner.kernel_choices.attention == "triton", runner.kernel_choices
    drafters = {ahead: Drafter(trained, spec, max_seq_len=256) for ahead in (False, True)}
    out = []
    for prompt in prompts:
        pair = [
            speculative_generate(
                runner, drafters[ahead], prompt, sampling=SamplingParams(), stop=stop, launch_ahead=ahead
            )
            for ahead in (False, True)
        ]
        out.append((pair[0], pair[1]))
    graphs = drafters[True]._graphs
    assert graphs is not None and any(key[0] == "extend_verified" for key in graphs._graphs), "no graph"
    return out


def assert_same(lockstep: DecodeTrace, ahead: DecodeTrace) -> None:
    assert (lockstep.loop, ahead.loop) == ("lockstep", "launch_ahead")
    assert ahead.token_ids == lockstep.token_ids
    assert ahead.finish_reason == lockstep.finish_reason
    assert ahead.accepted_per_round == lockstep.accepted_per_round
    assert ahead.emitted_per_round == lockstep.emitted_per_round


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_launch_ahead_matches_lockstep_and_plain_on_graphs(cuda_tiny, shape):
    tiny, trained = cuda_tiny
    pairs = run_both(tiny, trained, SPECS[shape], tiny.prompts, StopRule(TOKENS))
    for (lockstep, ahead), reference in zip(pairs, tiny.references, strict=True):
        assert ahead.token_ids == reference
        assert_same(lockstep, ahead)


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_eos_inside_a_round_on_graphs(cuda_tiny, shape):
    tiny, trained = cuda_tiny
    reference = tiny.references[0]
    ((free, _),) = run_both(tiny, trained, SPECS[shape], tiny.prompts[:1], StopRule(TOKENS))
    candidates = [k for k in inside_blocks(free) if reference[k] not in reference[:k]]
    assert candidates, f"no new token inside a multi-token round: {free.emitted_per_round}"
    k = candidates[0]
    stop = StopRule(TOKENS, eos_token_ids=frozenset({reference[k]}))
    ((lockstep, ahead),) = run_both(tiny, trained, SPECS[shape], tiny.prompts[:1], stop)
    assert ahead.token_ids == reference[: k + 1] and ahead.finish_reason == "eos"
    assert_same(lockstep, ahead)
