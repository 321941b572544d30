"""One speculative decoder, one decode at a time, and a bounded queue in front of it.

Requests queue behind the decoder (batch 1): at most `max_queue` wait while one decodes; one more
is answered HTTP 503 with a `Retry-After` (seconds: the mean decode time so far times the requests
ahead, at least 1). Decoding runs on a single dedicated thread, so the event loop keeps answering
/health, /metrics and other clients meanwhile (torch releases the GIL in its kernels).
`serve --max-batch N` (N > 1) decodes up to N together instead: `serve.batch_worker`, the same
queue with a continuous-batching loop behind it (`max_batch` rows, then `max_queue` waiting).

A job whose client goes away is cancelled: still waiting, it leaves the queue at once (its slot is
free for the next request) and never decodes; decoding, it stops at the end of the current round
(the engine's `on_round` callback returns False), so the decoder is free within one round.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eaglewire.serve.metrics import ServerMetrics
from eaglewire.serve.protocol import RequestError
from eaglewire.serve.responses import openai_finish_reason

if TYPE_CHECKING:
    from eaglewire.engine.api import GenerationResult, SpeculativeDecoder
    from eaglewire.engine.sampling import SamplingParams

log = logging.getLogger(__name__)

RETRY_AFTER_MAX = 600


@dataclass
class Job:
    """One generation to run. `on_tokens` (optional) gets each round's kept tokens, on the decode thread."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    on_tokens: Callable[[list[int]], None] | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    state: str = "new"  # new | waiting | running | done | dropped (cancelled before it ran)
    queued_at: float = 0.0
    started_at: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


class DecodeQueue:
    """The decode thread and its bounded queue. `submit` from the event loop; `cancel` from anywhere."""

    max_batch = 1  # requests decoding at once (`serve.batch_worker.BatchDecodeQueue`: more)

    def __init__(self, decoder: SpeculativeDecoder, max_queue: int, metrics: ServerMetrics) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue: expected >= 0, got {max_queue}")
        self.decoder = decoder
        self.metrics = metrics
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._durations: deque[float] = deque(maxlen=32)
        self._by_id: dict[int, Job] = {}  # the jobs queued or decoding, for `cancel_all`
        self._start_worker()

    def _start_worker(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="eaglewire-decode"
        )

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return self._waiting

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: mean decode time x requests ahead / rows (>= 1)."""
        with self._lock:
            mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
            ahead = self._waiting + self._running
        return max(1, min(RETRY_AFTER_MAX, math.ceil(mean * ahead / self.max_batch)))

    def submit(self, job: Job) -> asyncio.Future[GenerationResult | None]:
        """Queue `job` (RequestError 503 when the queue is full). The future's result is None when the
        job was cancelled before it started."""
        with self._lock:
            full = self._waiting >= self.max_queue and self._running + self._waiting >= self.max_batch
            if not full:
                self._waiting += 1
                job.state = "waiting"
                job.queued_at = time.monotonic()
                self._by_id[id(job)] = job
        if full:
            retry = self.retry_after()
            decoding = (
                "one request is decoding"
                if self.max_batch == 1
                else f"{self.max_batch} requests are decoding (--max-batch {self.max_batch})"
            )
            raise RequestError(
                f"the server is busy: {decoding} and {self.max_queue} wait (--max-queue "
                f"{self.max_queue}); retry after {retry} s",
                status=503,
                type="server_overloaded",
                code="queue_full",
                headers={"Retry-After": str(retry)},
            )
        return asyncio.wrap_future(self._start(job))

    def _start(self, job: Job) -> concurrent.futures.Future[GenerationResult | None]:
        """Hand a queued job to the decode thread; the future resolves when it ends."""
        return self._executor.submit(self._run, job)

    def _dropped(self, job: Job) -> None:
        """A waiting job was cancelled (under the lock): the batched queue takes it out of its line."""

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job if it still waits, else stop it at the next round."""
        with self._lock:
            job.cancel_event.set()
            dropped = job.state == "waiting"
            if dropped:
                job.state = "dropped"
                self._waiting -= 1
                self._by_id.pop(id(job), None)
                self._dropped(job)
        if dropped:
            self.metrics.record_dropped()

    def cancel_all(self) -> int:
        """Cancel every queued and decoding job (shutting down); returns how many there were."""
        with self._lock:
            jobs = list(self._by_id.values())
        for job in jobs:
            self.cancel(job)
        return len(jobs)

    def _run(self, job: Job) -> GenerationResult | None:
        with self._lock:
            if job.state == "dropped":
                return None
            job.state = "running"
            self._waiting -= 1
            self._running += 1
        job.started_at = time.monotonic()

        def on_round(kept: list[int]) -> bool:
            if job.on_tokens is not None and kept:
                job.on_tokens(kept)
            return not job.cancel_event.is_set()

        try:
            result = self.decoder.generate(
                job.prompt_ids,
                max_new_tokens=job.max_new_tokens,
                sampling=job.sampling,
                stop=job.stop,
                on_round=on_round,
            )
        except BaseException:
            self.metrics.record_error()
            raise
        else:
            self._record(job, result)
            return result
        finally:
            self._finished(job, time.monotonic() - job.started_at)

    def _record(self, job: Job, result: GenerationResult) -> None:
        """Every generation counts, a cancelled one too (its client is gone: nobody else records it)."""
        self.metrics.record_generation(
            prompt_tokens=len(job.prompt_ids),
            completion_tokens=len(result.token_ids),
            accepted_per_round=result.accepted_per_round,
            finished=openai_finish_reason(result.finish_reason),
        )

    def _finished(self, job: Job, seconds: float) -> None:
        with self._lock:
            self._running -= 1
            job.state = "done"
            self._by_id.pop(id(job), None)
            self._durations.append(seconds)

    def warm_up(self) -> None:
        """One short generation on the decode thread before the first request (the runtime's first
        forwards allocate and, on CUDA, capture graphs); counted nowhere."""

        def run() -> None:
            prompt = (self.decoder.encode("Hello", chat=False) or [0])[:1]  # fits any usable context
            self.decoder.generate(prompt, max_new_tokens=1)

        self._executor.submit(run).result()

    def shutdown(self) -> None:
        """Cancel nothing by itself (callers cancel their jobs); wait for the decode thread to end."""
        self._executor.shutdown(wait=True, cancel_futures=True)
