"""Per-phase timers for the decoding loops: draft, verify, accept (acceptance + KV compaction), host.

    timers = PhaseTimers(enabled=True, device=runner.device)
    with timers.phase("draft"):
        ...
    timers.summary()  # {"draft": seconds, ...}
    timers.reset()    # the next generation reuses the same events and phase objects

Off (the default), `phase` returns one shared do-nothing context manager: no clock read, no
allocation. On CPU a phase reads perf_counter. On a CUDA device a phase records a pair of CUDA
events (no host synchronisation); they are resolved once, in `summary`.

At batch 1 the decoding loop is host-bound (a round's host time exceeds its kernels' time), so on
CUDA a phase does as little host work as it can:
  - One stream, looked up once. Events are recorded on the current stream of `device` as it is
    when timing starts (the first phase after construction or `reset`), or on `stream=` when one
    is given, and that stream object is passed to every record: `Event.record()` without one looks
    the current stream up (a device-index resolution) on every call. A loop that switched streams
    mid-generation would still be timed on the first one; the engine's loops never switch.
  - Pooled events. Each phase takes its start and end events from an `EventPool`, and `summary`
    (once it has read them) or `reset` (dropping them) hands them back. The events of a generation
    are read only at its end (one host sync in `summary`), so a generation of R rounds holds about
    2 x phases x R of them, allocated the first time. A caller running many generations keeps one
    PhaseTimers and resets it between them (`speculative_generate(timers=...)` does the reset):
    after the first generation the pool covers the next ones of the same size and none allocates.
    A PhaseTimers made for a single generation still allocates each of its events once, as before.
    The pool belongs to its PhaseTimers (or is passed in): no module-level state.
  - One phase object per name, reused by every `phase(name)` (the `with timers.phase(...)` sites
    stay as they are); a name is not re-entered inside itself (that raises).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from types import TracebackType

import torch

PHASES = ("draft", "verify", "accept", "host")


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


class EventPool:
    """Timing events handed out by `take` and taken back by `give_back`, allocated (`new_event`)
    only when none is free: a pool that has covered one generation covers the next of its size."""

    def __init__(self, new_event: Callable[[], torch.cuda.Event] = _timing_event) -> None:
        self._new_event = new_event
        self._free: list[torch.cuda.Event] = []
        self.allocated = 0  # events ever made by this pool

    def take(self) -> torch.cuda.Event:
        if self._free:
            return self._free.pop()
        self.allocated += 1
        return self._new_event()

    def give_back(self, *events: torch.cuda.Event) -> None:
        """Events whose timings were read or dropped: the caller no longer reads them."""
        self._free.extend(events)

    @property
    def available(self) -> int:
        return len(self._free)


class _Off:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


_OFF = _Off()


def _reentered(name: str) -> RuntimeError:
    # a phase object is reused per name, so an inner `with` of the same name would overwrite the
    # outer one's start; no loop nests a phase in itself
    return RuntimeError(f"timer phase {name!r} entered while it is already open")


class _CpuPhase:
    __slots__ = ("_name", "_start", "_timers")

    def __init__(self, timers: PhaseTimers, name: str) -> None:
        self._timers, self._name = timers, name
        self._start: float | None = None

    def __enter__(self) -> None:
        if self._start is not None:
            raise _reentered(self._name)
        self._start = time.perf_counter()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        start, self._start = self._start, None
        assert start is not None  # __enter__ set it
        self._timers._seconds[self._name] += time.perf_counter() - start
        self._timers._counts[self._name] += 1


class _CudaPhase:
    __slots__ = ("_name", "_start", "_timers")

    def __init__(self, timers: PhaseTimers, name: str) -> None:
        self._timers, self._name = timers, name
        self._start: torch.cuda.Event | None = None

    def __enter__(self) -> None:
        if self._start is not None:
            raise _reentered(self._name)
        timers = self._timers
        stream = timers._stream
        if stream is None:  # the first phase of this generation (module doc)
            stream = timers._stream = torch.cuda.current_stream(timers.device)
        start = timers._pool.take()
        start.record(stream)
        self._start = start

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        timers = self._timers
        start, self._start = self._start, None
        assert start is not None  # __enter__ set it
        end = timers._pool.take()
        end.record(timers._stream)
        timers._pending.append((self._name, start, end))
        timers._counts[self._name] += 1


class PhaseTimers:
    """Accumulated time per phase name (any name; PHASES are the engine's).

    On CUDA: stream = the stream to record on (None: the current stream of `device` when timing
    starts, looked up again after each `reset`); pool = where the events come from (None: its own).
    """

    def __init__(
        self,
        enabled: bool = False,
        device: torch.device | str | None = None,
        *,
        stream: torch.cuda.Stream | None = None,
        pool: EventPool | None = None,
    ) -> None:
        self.enabled = enabled
        self.device = None if device is None else torch.device(device)
        self.cuda = enabled and self.device is not None and self.device.type == "cuda"
        self._fixed_stream = stream
        self._stream = stream
        self._pool = pool if pool is not None else EventPool()
        self._phases: dict[str, _CpuPhase | _CudaPhase] = {}
        self._seconds: defaultdict[str, float] = defaultdict(float)
        self._counts: defaultdict[str, int] = defaultdict(int)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def pool(self) -> EventPool:
        return self._pool

    def phase(self, name: str) -> _Off | _CpuPhase | _CudaPhase:
        """Context manager timing its block under `name` (free when disabled)."""
        if not self.enabled:
            return _OFF
        phase = self._phases.get(name)
        if phase is None:
            phase = self._phases[name] = _CudaPhase(self, name) if self.cuda else _CpuPhase(self, name)
        return phase

    def _resolve(self) -> None:
        pending = self._pending
        if not pending:
            return
        # every event is on one stream, so the last one completing means they all have
        pending[-1][2].synchronize()
        for name, start, end in pending:
            self._seconds[name] += start.elapsed_time(end) / 1000.0
            self._pool.give_back(start, end)
        pending.clear()

    def summary(self) -> dict[str, float]:
        """Seconds per phase so far (one host sync on CUDA, to read the events)."""
        self._resolve()
        return dict(self._seconds)

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def reset(self) -> None:
        """Forget the timings (unread events go back to the pool unread) and, unless one was given,
        the stream: the next phase looks up the current one again."""
        for _, start, end in self._pending:
            # re-recording an event the GPU has not reached yet is fine: it then marks the new point
            self._pool.give_back(start, end)
        self._pending.clear()
        self._seconds.clear()
        self._counts.clear()
        self._stream = self._fixed_stream
