"""Per-phase timers for the decoding loops: draft, verify, accept (acceptance + KV compaction), host.

    timers = PhaseTimers(enabled=True, device=runner.device)
    with timers.phase("draft"):
        ...
    timers.summary()  # {"draft": seconds, ...}

Off (the default), `phase` returns one shared do-nothing context manager: no clock read, no
allocation. On a CUDA device each phase records a pair of CUDA events on the current stream (no
host synchronisation); they are resolved once, in `summary`. On CPU it reads perf_counter.
"""

from __future__ import annotations

import time
from collections import defaultdict
from types import TracebackType

import torch

PHASES = ("draft", "verify", "accept", "host")


class _Off:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


_OFF = _Off()


class _CpuPhase:
    __slots__ = ("_name", "_start", "_timers")

    def __init__(self, timers: PhaseTimers, name: str) -> None:
        self._timers, self._name, self._start = timers, name, 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._timers._seconds[self._name] += time.perf_counter() - self._start
        self._timers._counts[self._name] += 1


class _CudaPhase:
    __slots__ = ("_end", "_name", "_start", "_timers")

    def __init__(self, timers: PhaseTimers, name: str) -> None:
        self._timers, self._name = timers, name
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def __enter__(self) -> None:
        self._start.record()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end.record()
        self._timers._pending.append((self._name, self._start, self._end))
        self._timers._counts[self._name] += 1


class PhaseTimers:
    """Accumulated time per phase name (any name; PHASES are the engine's)."""

    def __init__(self, enabled: bool = False, device: torch.device | str | None = None) -> None:
        self.enabled = enabled
        self.cuda = enabled and device is not None and torch.device(device).type == "cuda"
        self._seconds: defaultdict[str, float] = defaultdict(float)
        self._counts: defaultdict[str, int] = defaultdict(int)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def phase(self, name: str) -> _Off | _CpuPhase | _CudaPhase:
        """Context manager timing its block under `name` (free when disabled)."""
        if not self.enabled:
            return _OFF
        return _CudaPhase(self, name) if self.cuda else _CpuPhase(self, name)

    def _resolve(self) -> None:
        if not self._pending:
            return
        self._pending[-1][2].synchronize()
        for name, start, end in self._pending:
            self._seconds[name] += start.elapsed_time(end) / 1000.0
        self._pending.clear()

    def summary(self) -> dict[str, float]:
        """Seconds per phase so far (one host sync on CUDA, to read the events)."""
        self._resolve()
        return dict(self._seconds)

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def reset(self) -> None:
        self._pending.clear()
        self._seconds.clear()
        self._counts.clear()
