"""Refusals of `eaglewire serve` before it listens (exit 2, nothing written). The passing way, a server
that answers and stops cleanly on a signal, is tests/unit/serve/test_serve_cli.py (a server must be
talked to while it runs, which a one-shot case cannot do)."""

from __future__ import annotations

from tests.faults.harness import Case

SERVE = "serve --device cpu --port 0"


CASES = [
    Case(
        "serve:port-out-of-range",
        "serve --target {ws}/target --port 70000",
        2,
        says=("--port: expected 0 <= --port <= 65535", "70000"),
    ),
    Case(
        "serve:engine-names-another-format",
        f"{SERVE} --target {{ws}}/target --draft {{ws}}/qs/export/sglang --engine vllm",
        2,
        says=("--engine vllm", "{ws}/qs/export/sglang/config.json is a sglang export", "--engine sglang"),
    ),
    Case(
        "serve:draft-for-another-target",
        f"{SERVE} --target {{ws}}/target5 --draft {{ws}}/qs/train/draft",
        2,
        says=("names a different target", "target.num_layers: draft contract=8 live target=5"),
    ),
    Case(
        "serve:sglang-version-not-a-release",
        f"{SERVE} --target {{ws}}/target --draft {{ws}}/qs/export/sglang --sglang-version latest",
        2,
        says=("--sglang-version: expected a release number such as 0.5.23, got 'latest'",),
    ),
    Case(
        "serve:max-batch-zero",
        "serve --target {ws}/target --max-batch 0",
        2,
        says=("--max-batch: expected >= 1 (requests decoded together), got 0",),
    ),
    Case(
        "serve:max-batch-negative",
        f"{SERVE} --target {{ws}}/target --draft {{ws}}/qs/train/draft --max-batch -4",
        2,
        says=("--max-batch: expected >= 1 (requests decoded together), got -4",),
    ),
    Case(
        "serve:max-batch-on-the-hf-runner",
        "serve --target {ws}/target --max-batch 4 --runner hf",
        2,
        says=("--max-batch 4 with --runner hf", "fix: use --runner auto or fast"),
    ),
]
