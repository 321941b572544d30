"""A saved bench.json read back: its prompts encoded as the bench encoded them, and its plain text.

Scripts that replay a draft over a finished bench's text (`benchmarks/served_by_category.py`,
`benchmarks/served_tree_grid.py`, `benchmarks/draft_levers.py`) start here, then call
`eaglewire.predict.served`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglewire.bench.harness import Workload
from eaglewire.bench.prompts import load_prompt_set
from eaglewire.bench.results import MethodResult
from eaglewire.errors import ConfigError
from eaglewire.target.loading import LoadedTarget


def bench_plain_text(
    bench: dict[str, Any], target: LoadedTarget, where: Path
) -> tuple[list[list[int]], MethodResult]:
    """A saved bench.json's prompts, encoded as the bench encoded them, and its plain method's runs
    (the target's greedy text, which every lossless setting serves too: any draft can be replayed
    over it). The prompt lengths must match the bench's record, else the chat template or the prompt
    set moved; `where` (the file) names the mismatch."""
    if "plain" not in bench.get("methods", {}):
        raise ConfigError(f"{where}: no 'plain' method in the bench, whose text a replay needs",
                          fix="use a bench.json of a run that timed plain decoding")  # fmt: skip
    plain = MethodResult.from_json(bench["methods"]["plain"])
    prompts = load_prompt_set(bench["prompts"], bench["num_prompts"])
    work = Workload.build(
        target, prompts, max_new_tokens=bench["max_new_tokens"], chat=bench["chat_template"]
    )
    lengths = [len(p) for p in work.prompt_ids]
    recorded = [r.prompt_tokens for r in plain.runs]
    if lengths != recorded:
        first = next(i for i, (a, b) in enumerate(zip(lengths, recorded, strict=True)) if a != b)
        raise ConfigError(
            f"{where}: prompt {plain.runs[first].prompt_id} encodes to {lengths[first]} tokens here but "
            f"{recorded[first]} in the bench",
            fix="use the tokenizer and prompt set the bench ran with",
        )
    return work.prompt_ids, plain
