"""`data regenerate --server` (issue 45 item 3): the refusals that come before any request is answered.

The runs through a live server, both ways (output equal to local regeneration; 503, 429 and dropped
connections retried; retries bounded by a named error; kill -9 + rerun), are in
tests/unit/data/test_regenerate_server.py: they need a server on a port the case cannot know in advance.
Here: an address that is not an http(s) URL; nothing listening there (refused at once, naming the URL
asked, not retried for minutes); the server-only flags without --server; Magpie prompts, which a chat
server cannot make. Each exits 2 and writes nothing.
"""

from __future__ import annotations

from tests.faults.harness import Case

REGENERATE = "data regenerate --target {ws}/target --out {ws}/regen.jsonl --no-progress"
INPUT = "--input {ws}/qs/data/train.jsonl"
NOBODY = "http://127.0.0.1:9"  # the discard port: nothing listens there

CASES = [
    Case(
        "regen:server-not-a-url",
        f"{REGENERATE} {INPUT} --server localhost:8000",
        2,
        says=("--server localhost:8000: expected an http(s) URL", "fix: pass --server http://HOST:PORT"),
    ),
    Case(
        "regen:server-nothing-answers",
        f"{REGENERATE} {INPUT} --server {NOBODY}",
        2,
        says=(f"--server {NOBODY}: nothing answers at {NOBODY}/v1/models", "fix: start the server first"),
    ),
    Case(
        "regen:server-flags-without-server",
        f"{REGENERATE} {INPUT} --model tiny --concurrency 4",
        2,
        says=("--model, --concurrency: only mean something with --server", "fix: add --server"),
    ),
    Case(
        "regen:magpie-through-a-server",
        f"{REGENERATE} --input builtin:magpie --server {NOBODY}",
        2,
        says=("--input builtin:magpie with --server", "fix: regenerate builtin:magpie without --server"),
    ),
]
