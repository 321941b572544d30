"""Timing for benchmarks: CUDA events on a GPU, perf_counter on CPU; warm-up, then the median of repeats.

    watch = Stopwatch(device)
    timed = watch.measure(lambda: run(prompt), warmup=1, repeats=3)
    timed.value, timed.seconds (median), timed.all_seconds

On CUDA the events are recorded on the current stream around the call and read once after a
synchronisation, so the number is device time from the first kernel launch to the last
kernel's end, including any host gaps in between (what a user waits for). The value returned is
the last repeat's (greedy decoding gives the same value every time).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from eaglewire.errors import ConfigError

T = TypeVar("T")


@dataclass
class Timed(Generic[T]):
    value: T  # what the last repeat returned
    seconds: float  # median over the repeats
    all_seconds: list[float]


class Stopwatch:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def once(self, fn: Callable[[], T]) -> tuple[T, float]:
        """Run `fn` once; (its value, seconds)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            value = fn()
            end.record()
            end.synchronize()
            return value, start.elapsed_time(end) / 1000.0
        t0 = time.perf_counter()
        value = fn()
        return value, time.perf_counter() - t0

    def measure(self, fn: Callable[[], T], *, warmup: int = 1, repeats: int = 3) -> Timed[T]:
        """`warmup` untimed calls, then `repeats` timed ones; the median of those."""
        if warmup < 0 or repeats < 1:
            raise ConfigError(
                f"timing: expected warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}"
            )
        for _ in range(warmup):
            fn()
        runs = [self.once(fn) for _ in range(repeats)]
        seconds = [s for _, s in runs]
        return Timed(value=runs[-1][0], seconds=statistics.median(seconds), all_seconds=seconds)
