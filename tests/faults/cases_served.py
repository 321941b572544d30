"""`eaglewire doctor --served` through the console script: an unreachable server is an input error (exit 2)
naming the URL, before any model loads. The verdicts both ways need a live server, which a one-shot case
cannot talk to: they are tests/unit/doctor/test_served_http.py (a correct export served: exit 0; edited
exports and a rewritten draft length: exit 1 naming the fault class and its fix), and with --concurrency
against a batching server tests/unit/serve/test_serve_batch_doctor.py. --concurrency out of range, or with
vLLM (whose counts are per request only one request at a time), is refused before the server is asked.
"""

from __future__ import annotations

from tests.faults.harness import Case

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens on it here

CASES = [
    Case(
        "served:unreachable",
        f"doctor --served {UNREACHABLE}/v1 --engine sglang --draft {{ws}}/qs/train/draft --target {{ws}}/target",
        2,
        says=(f"--served {UNREACHABLE}: cannot reach {UNREACHABLE}/v1/models", "fix: start the server"),
    ),
    Case(
        "served:concurrency-zero",
        f"doctor --served {UNREACHABLE}/v1 --engine eaglewire --draft {{ws}}/qs/train/draft --target {{ws}}/target "
        "--concurrency 0",
        2,
        says=("--concurrency: expected >= 1 (clients sending at once), got 0",),
    ),
    Case(
        "served:concurrency-with-vllm",
        f"doctor --served {UNREACHABLE}/v1 --engine vllm --draft {{ws}}/qs/train/draft --target {{ws}}/target "
        "--concurrency 8",
        2,
        says=("--concurrency 8 with --engine vllm", "fix: drop --concurrency with --engine vllm"),
    ),
]
