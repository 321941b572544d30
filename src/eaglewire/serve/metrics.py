"""The server's counters and `GET /metrics` in the Prometheus text format (version 0.0.4), by hand.

vLLM's names, labels and meanings where vLLM has the metric (vLLM 0.33.0: labels
`model_name`, `engine` from `vllm/v1/metrics/loggers.py` lines 499-504; a counter named `X` is
exposed as `X_total`, as prometheus_client does), so dashboards and clients written for vLLM read
this server unchanged:

    vllm:spec_decode_num_drafts_total                      verifications with a draft (spec_stats)
    vllm:spec_decode_num_draft_tokens_total                drafted tokens verified
    vllm:spec_decode_num_accepted_tokens_total             drafted tokens accepted (no bonus)
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}  rounds accepting >= i+1 drafts
    vllm:prompt_tokens_total, vllm:generation_tokens_total  tokens in / out (loggers.py 748, 799)
    vllm:request_success_total{finished_reason}            finished requests: stop | length | abort
                                                           | error (vllm/v1/engine/__init__.py FinishReason)
    vllm:num_requests_running{model_name,engine}          gauge: requests decoding now (up to --max-batch;
                                                           loggers.py registers both gauges with vLLM's labels)
    vllm:num_requests_waiting{model_name,engine}          gauge: requests queued behind them (--max-queue)

The spec-decode counters exist only when a draft is loaded (vLLM registers them only with a
speculative config: `vllm/v1/spec_decode/metrics.py` lines 211-213). Our own:

    eaglewire:requests_rejected_total{reason="queue_full"|"bad_request"}   answered 503 / 400
    eaglewire:requests_cancelled_total                     clients that went away before the end
    eaglewire:verifications_total                          target verification forwards

Acceptance length over a window, vLLM's way: 1 + rate(accepted_tokens) / rate(drafts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from eaglewire.serve.spec_stats import SpecCounters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FINISHED_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason strings


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}" if pairs else ""


class ServerMetrics:
    """Thread-safe: the decode thread records generations, the event loop renders and rejects."""

    def __init__(self, model_name: str, *, num_steps: int | None, num_draft_tokens: int | None) -> None:
        """num_steps / num_draft_tokens: the speculative shape, None without a draft."""
        self.model_name = model_name
        self._lock = threading.Lock()
        self._drafts_per_round = None if num_draft_tokens is None else num_draft_tokens - 1
        self.spec = None if num_steps is None else SpecCounters(num_positions=num_steps)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.verifications = 0
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        self.rejected = {"queue_full": 0, "bad_request": 0}
        self.cancelled = 0

    def record_generation(
        self, *, prompt_tokens: int, completion_tokens: int, accepted_per_round: Sequence[int], finished: str
    ) -> None:
        """One finished (or cancelled) generation. finished: an OpenAI finish reason, or "abort"."""
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += completion_tokens
            self.verifications += len(accepted_per_round)
            if self.spec is not None and self._drafts_per_round is not None:
                self.spec.observe(accepted_per_round, self._drafts_per_round)
            self.success[finished if finished in self.success else "abort"] += 1
            if finished == "abort":
                self.cancelled += 1

    def record_dropped(self) -> None:
        """A request whose client went away while it waited: it never decoded."""
        with self._lock:
            self.success["abort"] += 1
            self.cancelled += 1

    def record_error(self) -> None:
        """A generation that failed inside the engine (answered 500)."""
        with self._lock:
            self.success["error"] += 1

    def record_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def render(self, running: int, waiting: int) -> str:
        """The exposition text; `running` / `waiting`: the queue's gauges now."""
        base = (("model_name", self.model_name), ("engine", "0"))
        out: list[str] = []

        def family(
            name: str, kind: str, doc: str, samples: Callable[[], list[tuple[str, str, float]]]
        ) -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} {kind}")
            for suffix, labels, value in samples():
                out.append(f"{name}{suffix}{labels} {float(value)}")

        with self._lock:
            family(
                "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                lambda: [("", _labels(base), running)],
            )  # fmt: skip
            family(
                "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                lambda: [("", _labels(base), waiting)],
            )  # fmt: skip
            family(
                "vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
                lambda: [("_total", _labels(base), self.prompt_tokens)],
            )  # fmt: skip
            family(
                "vllm:generation_tokens", "counter", "Number of generation tokens processed.",
                lambda: [("_total", _labels(base), self.generation_tokens)],
            )  # fmt: skip
            family(
                "vllm:request_success", "counter", "Count of successfully processed requests.",
                lambda: [
                    ("_total", _labels((*base, ("finished_reason", r))), n) for r, n in self.success.items()
                ],
            )  # fmt: skip
            spec = self.spec
            if spec is not None:
                family(
                    "vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.",
                    lambda: [("_total", _labels(base), spec.num_drafts)],
                )  # fmt: skip
                family(
                    "vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.",
                    lambda: [("_total", _labels(base), spec.num_draft_tokens)],
                )  # fmt: skip
                family(
                    "vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.",
                    lambda: [("_total", _labels(base), spec.num_accepted_tokens)],
                )  # fmt: skip
                family(
                    "vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
                    "Accepted tokens per draft position.",
                    lambda: [
                        ("_total", _labels((*base, ("position", str(i)))), n)
                        for i, n in enumerate(spec.num_accepted_tokens_per_pos)
                    ],
                )  # fmt: skip
            family(
                "eaglewire:verifications", "counter", "Target verification forwards.",
                lambda: [("_total", _labels(base), self.verifications)],
            )  # fmt: skip
            family(
                "eaglewire:requests_rejected", "counter",
                "Requests answered 503 (queue full) or 400 (bad request).",
                lambda: [("_total", _labels((*base, ("reason", r))), n) for r, n in self.rejected.items()],
            )  # fmt: skip
            family(
                "eaglewire:requests_cancelled", "counter",
                "Requests whose client went away before the end (decoding stopped at the next round).",
                lambda: [("_total", _labels(base), self.cancelled)],
            )  # fmt: skip
        return "\n".join(out) + "\n"
