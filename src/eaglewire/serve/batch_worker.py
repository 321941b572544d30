"""`serve --max-batch N` (N > 1): up to N requests decode together on one continuous-batching engine.

The queue in front is `serve.worker.DecodeQueue`'s (the same 503 + Retry-After once N decode and
`max_queue` wait); behind it one decode thread runs this loop over a `BatchEngine` built once from the
decoder (`decoder.batch_engine(N, policy=...)`, its runner loaded with `max_batch_size=N`):

    move waiting jobs into the engine while it has a free row (running + waiting in it < N)
    engine.step()             admit them (prefill), one round for every running row
    resolve each finished job's future with `decoder.result_of(...)` (its own trace)
    nothing queued, nothing running: block on a condition (no busy loop)

Streaming and cancellation ride on each request's `on_round`: it hands the round's kept tokens to
`job.on_tokens`, and returns False once the job's cancel_event is set, so the engine frees the row at
the end of that round (finish_reason "cancelled") and the next waiting job is admitted in the next step.
A job cancelled while it still waits here never reaches the engine.

Every response's `sglext.spec_tokens_details` and the vLLM counters come from that request's own trace
(rows never see each other). Under a batch rule (`batch_policy`) a round may decode plainly: such a
round drafts nothing, so it counts as no draft in either report (its tokens still count as completion
tokens, so spec_accept_length = completion tokens / speculative verifications reads high for a
request that had plain rounds).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from eaglewire.errors import EaglewireError
from eaglewire.serve.metrics import ServerMetrics
from eaglewire.serve.worker import DecodeQueue, Job

if TYPE_CHECKING:
    from eaglewire.engine.api import GenerationResult, SpeculativeDecoder
    from eaglewire.engine.batch.engine import BatchEngine, BatchOutcome, Policy
    from eaglewire.engine.spec_args import SpecArgs

log = logging.getLogger(__name__)

MEASURE_BATCH_SIZES = "1,2,4,8,16,32,64"


def batch_policy(decoder: SpeculativeDecoder, draft_dir: str | None, target: str) -> Policy | None:
    """The rule the engine decodes by (logged): the draft directory's rule for this device when
    `eaglewire bench --batch-sizes` measured one, else None (the draft's setting at every batch size)."""
    from eaglewire.bench.report import describe_device
    from eaglewire.engine.batch.engine import setting_label
    from eaglewire.predict.by_batch import load_rule, rule_path, rule_policy

    if decoder.drafter is None or draft_dir is None:
        return None
    device = describe_device(decoder.runner.device)
    path = rule_path(Path(draft_dir), device)
    if not path.is_file():
        log.info(
            "no batch rule measured for %s (%s missing): speculation runs at every batch size; measure one "
            "with: eaglewire bench --target %s --draft %s --batch-sizes %s --methods plain,eagle-chain,eagle-tree",
            device,
            path,
            target,
            draft_dir,
            MEASURE_BATCH_SIZES,
        )
        return None
    rule = load_rule(path)
    label = setting_label(decoder.spec)
    log.info("decoding by the batch rule %s:\n%s", path, rule.describe())
    if label not in rule.taus:
        log.warning(
            "%s has no costs for the served setting %s (it has %s): plain decoding at every batch size",
            path,
            label,
            ", ".join(sorted(rule.taus)) or "none",
        )
    return rule_policy(rule, {label: decoder.spec})


class BatchDecodeQueue(DecodeQueue):
    """`DecodeQueue` with up to `max_batch` jobs decoding together (module doc)."""

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        max_queue: int,
        metrics: ServerMetrics,
        *,
        max_batch: int,
        policy: Policy | None = None,
    ) -> None:
        if max_batch < 2:
            raise ValueError(f"max_batch: expected >= 2 (1 is DecodeQueue), got {max_batch}")
        self.max_batch = max_batch
        self._round_spec: SpecArgs | None = None  # the setting the current round runs (the policy's)
        draft_spec = decoder.spec if decoder.drafter is not None else None
        chosen = policy or (lambda _running: draft_spec)

        def tracked(running: int) -> SpecArgs | None:
            self._round_spec = chosen(running)
            return self._round_spec

        self._policy: Policy = tracked
        self._engine: BatchEngine = decoder.batch_engine(max_batch, policy=tracked)
        self._line: deque[Job] = deque()  # waiting here, not yet in the engine
        self._futures: dict[int, concurrent.futures.Future[GenerationResult | None]] = {}
        self._in_engine: dict[int, tuple[Job, list[bool]]] = {}  # id(request) -> job, its rounds' kind
        self._stopping = False
        self._warm = threading.Event()
        self._warm_error: BaseException | None = None
        super().__init__(decoder, max_queue, metrics)

    # -- DecodeQueue's hooks -----------------------------------------------------------------------
    def _start_worker(self) -> None:
        # one lock for the counts, the line and the futures (`cancel` holds it while it calls `_dropped`)
        self._wake = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._loop, name="eaglewire-decode-batch", daemon=True)
        self._thread.start()

    def _start(self, job: Job) -> concurrent.futures.Future[GenerationResult | None]:
        future: concurrent.futures.Future[GenerationResult | None] = concurrent.futures.Future()
        with self._wake:
            self._futures[id(job)] = future
            if job.state == "dropped":  # cancelled between the count and here
                self._futures.pop(id(job))
                future.set_result(None)
            else:
                self._line.append(job)
                self._wake.notify()
        return future

    def _dropped(self, job: Job) -> None:  # under the lock (`DecodeQueue.cancel`)
        if job in self._line:
            self._line.remove(job)
        future = self._futures.pop(id(job), None)
        if future is not None:
            future.set_result(None)

    def warm_up(self) -> None:
        """Wait for the decode thread's warm-up generation (one token through the engine)."""
        self._warm.wait()
        if self._warm_error is not None:
            raise self._warm_error

    def shutdown(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()

    # -- the decode thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            prompt = (self.decoder.encode("Hello", chat=False) or [0])[:1]
            self._engine.run([self.decoder.batch_request(prompt, max_new_tokens=1)])
        except BaseException as e:  # noqa: BLE001 - handed to warm_up's caller
            self._warm_error = e
            self._warm.set()
            return
        self._warm.set()
        while True:
            admitted = self._take()
            if admitted is None:
                return
            for job in admitted:
                self._submit(job)
            if self._engine.idle:
                continue
            try:
                outcomes = self._engine.step()
            except Exception as e:  # every running job fails (HTTP 500); the loop goes on
                log.exception(
                    "the batch engine failed a round: failing its %d request(s)", len(self._in_engine)
                )
                self._fail_all(e)
                continue
            for outcome in outcomes:
                self._resolve(outcome)

    def _take(self) -> list[Job] | None:
        """Jobs to move into free rows (blocking while there is nothing to do); None: stop."""
        engine = self._engine
        with self._wake:
            while not self._line and engine.idle:
                if self._stopping:
                    return None
                self._wake.wait()
            while self._stopping and self._line:  # shutting down: what still waits never decodes
                job = self._line.popleft()
                job.state = "dropped"
                self._waiting -= 1
                self._by_id.pop(id(job), None)
                self._dropped(job)
            taken: list[Job] = []
            while self._line and engine.running + engine.waiting + len(taken) < self.max_batch:
                job = self._line.popleft()
                job.state = "running"
                self._waiting -= 1
                self._running += 1
                job.started_at = time.monotonic()
                taken.append(job)
        return taken

    def _submit(self, job: Job) -> None:
        rounds: list[bool] = []  # per round: whether it drafted (a batch rule may decode plainly)

        def on_round(kept: list[int]) -> bool:
            rounds.append(self._round_spec is not None)
            if job.on_tokens is not None and kept:
                job.on_tokens(kept)
            return not job.cancel_event.is_set()

        request = self.decoder.batch_request(
            job.prompt_ids,
            max_new_tokens=job.max_new_tokens,
            sampling=job.sampling,
            stop=job.stop,
            on_round=on_round,
        )
        try:
            self._engine.submit(request)
        except EaglewireError as e:  # prompt + max_new_tokens do not fit: the client's (HTTP 400)
            self._end(job, exception=e)
            return
        self._in_engine[id(request)] = (job, rounds)

    def _resolve(self, outcome: BatchOutcome) -> None:
        job, rounds = self._in_engine.pop(id(outcome.request))
        result = self.decoder.result_of(
            outcome.request, outcome.trace, decode_seconds=outcome.finished_at - outcome.started_at
        )
        if not all(rounds):  # plain rounds drafted nothing: no drafts in the spec statistics
            result = replace(
                result,
                accepted_per_round=[a for a, s in zip(result.accepted_per_round, rounds, strict=True) if s],
            )
        self._record(job, result)
        self._end(job, result=result, seconds=outcome.finished_at - outcome.started_at)

    def _fail_all(self, error: BaseException) -> None:
        jobs = [job for job, _ in self._in_engine.values()]
        self._in_engine.clear()
        for job in jobs:
            self._end(job, exception=error)
        self._engine = self.decoder.batch_engine(self.max_batch, policy=self._policy)  # fresh rows

    def _end(
        self,
        job: Job,
        *,
        result: GenerationResult | None = None,
        exception: BaseException | None = None,
        seconds: float | None = None,
    ) -> None:
        if exception is not None:
            self.metrics.record_error()
        started = job.started_at if job.started_at is not None else time.monotonic()
        self._finished(job, seconds if seconds is not None else time.monotonic() - started)
        with self._lock:
            future = self._futures.pop(id(job), None)
        if future is None:
            return
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
