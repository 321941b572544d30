"""PhaseTimers (`engine.timers`): the CPU path's sums, counts and reset; on the CUDA path, run here
with fake events and a fake stream (the pool and the stream are what it takes from outside), one
stream passed to every record, the events pooled and reused after `summary`/`reset`, one phase
object per name; and `speculative_generate(timers=...)` resetting a PhaseTimers it is given."""

from __future__ import annotations

import time

import pytest
import torch

from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.timers import EventPool, PhaseTimers
from eaglewire.engine.verify import StopRule
from eaglewire.errors import ConfigError


class FakeClock:
    """Device time in ms, moved by hand (what the kernels between two events would take)."""

    def __init__(self) -> None:
        self.ms = 0.0


class FakeEvent:
    """The part of torch.cuda.Event that PhaseTimers uses, on a FakeClock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: float | None = None
        self.streams: list[object] = []  # the stream of each record
        self.synchronized = 0
        self.read = 0  # elapsed_time calls with this event as the start

    def record(self, stream: object = None) -> None:
        self.streams.append(stream)
        self.at = self.clock.ms

    def synchronize(self) -> None:
        self.synchronized += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None, "an event read before it was recorded"
        self.read += 1
        return end.at - self.at


class FakeCuda:
    """A CUDA-path PhaseTimers on fake events; `made` lists every event its pool allocated."""

    def __init__(self, stream: object | None = "stream") -> None:
        self.clock = FakeClock()
        self.made: list[FakeEvent] = []
        self.pool = EventPool(new_event=self._new)
        self.timers = PhaseTimers(enabled=True, device="cuda", stream=stream, pool=self.pool)

    def _new(self) -> FakeEvent:
        self.made.append(FakeEvent(self.clock))
        return self.made[-1]

    def generation(self, rounds: int, ms: dict[str, float]) -> None:
        """`rounds` rounds of the phases in `ms`, each taking its ms of device time."""
        for _ in range(rounds):
            for name, took in ms.items():
                with self.timers.phase(name):
                    self.clock.ms += took
            self.clock.ms += 0.25  # time between rounds belongs to no phase


ROUND = {"draft": 1.0, "verify": 2.0, "accept": 0.5}


# --- the CPU path


def test_cpu_phases_sum_count_and_reset() -> None:
    timers = PhaseTimers(enabled=True, device="cpu")
    for _ in range(3):
        with timers.phase("verify"):
            time.sleep(0.002)
    with timers.phase("host"):
        pass
    summary = timers.summary()
    assert summary["verify"] >= 0.006 and summary["host"] < summary["verify"]
    assert timers.counts() == {"verify": 3, "host": 1}
    timers.reset()
    assert timers.summary() == {} and timers.counts() == {}
    with timers.phase("verify"):  # a reset PhaseTimers times again, from zero
        time.sleep(0.001)
    assert timers.counts() == {"verify": 1} and 0.001 <= timers.summary()["verify"] < summary["verify"]


def test_cpu_phase_objects_are_reused_and_not_reentered() -> None:
    timers = PhaseTimers(enabled=True, device="cpu")
    draft = timers.phase("draft")
    assert timers.phase("draft") is draft and timers.phase("verify") is not draft
    with draft, pytest.raises(RuntimeError, match="'draft' entered while it is already open"), draft:
        pass
    with timers.phase("draft"):  # closed again after the error: usable
        pass
    assert timers.counts() == {"draft": 2}


def test_cpu_phase_counts_when_its_block_raises() -> None:
    timers = PhaseTimers(enabled=True, device="cpu")
    with pytest.raises(ValueError), timers.phase("accept"):
        raise ValueError("inside")
    with timers.phase("accept"):
        pass
    assert timers.counts() == {"accept": 2}


def test_disabled_timers_allocate_no_events() -> None:
    fake = FakeCuda()
    timers = PhaseTimers(enabled=False, device="cuda", pool=fake.pool)
    assert timers.phase("draft") is timers.phase("verify")  # one shared do-nothing context
    with timers.phase("draft"):
        pass
    assert fake.made == [] and timers.summary() == {} and timers.counts() == {} and not timers.cuda


# --- the CUDA path, on fake events


def test_cuda_sums_are_the_events_elapsed_times() -> None:
    fake = FakeCuda()
    fake.generation(4, ROUND)
    summary = fake.timers.summary()
    assert summary == pytest.approx({name: 4 * ms / 1000.0 for name, ms in ROUND.items()})
    assert fake.timers.counts() == dict.fromkeys(ROUND, 4)
    assert list(summary) == list(ROUND)  # first-seen order, as before
    # one host sync per summary, on the newest event (one stream: it completes last)
    assert [e.synchronized for e in fake.made] == [0] * (len(fake.made) - 1) + [1]
    assert sum(e.read for e in fake.made) == 4 * len(ROUND)  # each pair read once
    assert fake.timers.summary() == summary  # nothing pending: no second sync, same sums
    assert fake.made[-1].synchronized == 1


def test_cuda_records_on_the_one_stream_given() -> None:
    fake = FakeCuda(stream="the stream")
    fake.generation(3, ROUND)
    assert {s for e in fake.made for s in e.streams} == {"the stream"}


def test_cuda_stream_is_looked_up_once_per_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[object] = []

    def current_stream(device: object = None) -> str:
        looked_up.append(device)
        return f"current #{len(looked_up)}"

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    fake = FakeCuda(stream=None)
    assert looked_up == []  # not at construction: when timing starts
    fake.generation(5, ROUND)
    assert looked_up == [torch.device("cuda")]
    assert {s for e in fake.made for s in e.streams} == {"current #1"}
    fake.timers.summary()
    fake.timers.reset()  # the next generation looks the current stream up again, once
    fake.generation(5, ROUND)
    assert len(looked_up) == 2
    assert all(e.streams[-1] == "current #2" for e in fake.made)


def test_cuda_events_are_reused_after_summary_and_reset() -> None:
    fake = FakeCuda()
    rounds = 6
    fake.generation(rounds, ROUND)
    per_generation = 2 * len(ROUND) * rounds  # every pending event is live until summary
    assert fake.pool.allocated == len(fake.made) == per_generation and fake.pool.available == 0
    first = fake.timers.summary()
    assert fake.pool.available == per_generation  # all handed back once read

    fake.timers.reset()
    fake.generation(rounds, ROUND)  # a second generation of the same size: no new event
    assert fake.pool.allocated == per_generation and fake.pool.available == 0
    assert all(len(e.streams) == 2 for e in fake.made)  # each event recorded once per generation
    assert fake.timers.summary() == pytest.approx(first)  # its own sums, not added to the first's

    fake.timers.reset()
    fake.generation(rounds + 1, ROUND)  # a longer one allocates only the extra round's events
    assert fake.pool.allocated == per_generation + 2 * len(ROUND)


def test_reset_hands_unread_events_back_unread() -> None:
    fake = FakeCuda()
    fake.generation(2, ROUND)
    fake.timers.reset()  # dropped without a summary (no sync, nothing read)
    assert fake.pool.available == fake.pool.allocated == 2 * 2 * len(ROUND)
    assert all(e.read == 0 and e.synchronized == 0 for e in fake.made)
    assert fake.timers.summary() == {} and fake.timers.counts() == {}
    fake.generation(2, ROUND)
    assert fake.pool.allocated == 2 * 2 * len(ROUND)
    assert fake.timers.summary() == pytest.approx({n: 2 * ms / 1000.0 for n, ms in ROUND.items()})


def test_cuda_phase_objects_are_reused_and_not_reentered() -> None:
    fake = FakeCuda()
    verify = fake.timers.phase("verify")
    assert fake.timers.phase("verify") is verify
    with verify, pytest.raises(RuntimeError, match="already open"), fake.timers.phase("verify"):
        pass
    assert fake.timers.counts() == {"verify": 1} and len(fake.made) == 2


def test_a_pool_shared_by_timers_in_turn_is_reused() -> None:
    fake = FakeCuda()
    fake.generation(3, ROUND)
    fake.timers.summary()
    other = PhaseTimers(enabled=True, device="cuda", stream="s", pool=fake.pool)
    for _ in range(3):
        for name in ROUND:
            with other.phase(name):
                pass
    assert fake.pool.allocated == 2 * 3 * len(ROUND)


# --- speculative_generate with a PhaseTimers given


def test_speculative_generate_resets_and_fills_the_timers_given(tiny) -> None:
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=128)
    timers = PhaseTimers(enabled=True, device=runner.device)
    stop = StopRule(6)
    traces = [
        speculative_generate(
            runner, None, tiny.prompts[0], sampling=SamplingParams(), stop=stop, timers=timers
        )
        for _ in range(2)
    ]
    for trace in traces:
        assert set(trace.phase_seconds) >= {"prefill", "draft", "verify", "accept"}
        assert all(v > 0 for v in trace.phase_seconds.values())
    # the second generation's counts only (reset at its start): one prefill, a draft per round
    counts = timers.counts()
    assert counts["prefill"] == 1 and counts["verify"] == traces[1].num_verifications
    assert traces[1].phase_seconds == timers.summary()


def test_speculative_generate_refuses_cuda_timers_for_a_cpu_runner(tiny) -> None:
    runner = make_runner(tiny.target, tiny.contract.aux_boundaries, "fast", max_seq_len=128)
    timers = PhaseTimers(enabled=True, device="cuda", pool=FakeCuda().pool)
    with pytest.raises(ConfigError, match="timers were made for device cuda"):
        speculative_generate(runner, None, [17], sampling=SamplingParams(), stop=StopRule(2), timers=timers)
