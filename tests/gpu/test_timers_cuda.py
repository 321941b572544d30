"""On CUDA, PhaseTimers (`engine.timers`) times phases with pooled events on one stream: the sums
match the wall time of a known workload (GPU spin kernels, host sleeps), and a second generation of
the same size, after `reset`, allocates no event, also through `speculative_generate(timers=...)`.

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import time

import pytest
import torch

from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.timers import PhaseTimers
from eaglewire.engine.verify import StopRule
from tests.helpers.tiny import make_tiny_target
from tests.unit.engine.conftest import AUX_BOUNDARIES, NUM_LAYERS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROUNDS = 20


def spin_cycles(seconds: float) -> int:
    """GPU clock cycles that `torch.cuda._sleep` spins for about `seconds` (measured: clocks vary)."""
    torch.cuda._sleep(1_000_000)  # warm the clocks and the kernel
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * seconds / (start.elapsed_time(end) / 1000.0))


def generation(timers: PhaseTimers, cycles: int) -> float:
    """ROUNDS rounds of kernel, host and kernel phases; the wall time until all of them finished."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(ROUNDS):
        with timers.phase("draft"):
            torch.cuda._sleep(cycles)
        with timers.phase("host"):  # the GPU idles: the events are the host's sleep apart
            torch.cuda.synchronize()
            time.sleep(0.0005)
        with timers.phase("verify"):
            torch.cuda._sleep(2 * cycles)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def test_phase_sums_match_the_workload_and_the_pool_is_reused() -> None:
    cycles = spin_cycles(0.001)  # ~1 ms draft, ~2 ms verify, ~0.5 ms host a round
    timers = PhaseTimers(enabled=True, device="cuda")
    walls, summaries = [], []
    for _ in range(2):
        timers.reset()
        walls.append(generation(timers, cycles))
        summaries.append(timers.summary())
        if len(walls) == 1:
            allocated = timers.pool.allocated
            assert allocated == 2 * 3 * ROUNDS  # made while the first generation ran
            assert timers.pool.available == allocated  # all handed back by summary
    assert timers.pool.allocated == allocated, "the second generation allocated events"
    for wall, summary in zip(walls, summaries, strict=True):
        assert all(v > 0 for v in summary.values()) and set(summary) == {"draft", "verify", "host"}
        total = sum(summary.values())
        assert total <= wall * 1.02, (summary, wall)  # never more than the wall (2%: two clocks)
        assert total >= 0.8 * wall, (summary, wall)  # and cover nearly all of it (no idle host)
        assert 1.6 < summary["verify"] / summary["draft"] < 2.4, summary  # 2x the spin
        assert summary["host"] >= ROUNDS * 0.0005 * 0.9, summary
    assert timers.counts() == dict.fromkeys(("draft", "host", "verify"), ROUNDS)


def test_speculative_generate_reuses_the_events_of_the_timers_given() -> None:
    target = make_tiny_target("llama", num_layers=NUM_LAYERS)
    target.model.to("cuda")
    runner = make_runner(target, AUX_BOUNDARIES, "fast", max_seq_len=128)
    timers = PhaseTimers(enabled=True, device=runner.device)
    prompt, stop = [1, 17, 42, 7], StopRule(12)
    traces, allocated, walls = [], [], []
    for _ in range(3):  # the first also captures the graphs
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        traces.append(
            speculative_generate(runner, None, prompt, sampling=SamplingParams(), stop=stop, timers=timers)
        )
        walls.append(time.perf_counter() - t0)  # summary synchronised the stream
        allocated.append(timers.pool.allocated)
    assert traces[0].loop == "launch_ahead"
    assert traces[1].token_ids == traces[2].token_ids == traces[0].token_ids
    assert allocated[0] > 0 and allocated[1] == allocated[2] == allocated[0], allocated
    for trace, wall in zip(traces[1:], walls[1:], strict=True):
        assert all(v > 0 for v in trace.phase_seconds.values())
        assert {"prefill", "draft", "verify", "accept"} <= set(trace.phase_seconds)
        # events are read on the GPU's clock, the wall on the host's: 2% for the two clocks
        assert sum(trace.phase_seconds.values()) <= wall * 1.02, (trace.phase_seconds, wall)
