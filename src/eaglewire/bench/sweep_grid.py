"""A sweep's grid: the default values of each SGLang setting, and which combinations are run.

Only combinations `eaglewire.engine.spec_args.SpecArgs` accepts unchanged are run (SGLang
semantics: topk=1 means num_draft_tokens = num_steps + 1; num_draft_tokens - 1 <= topk +
(num_steps-1)*topk^2); combinations that draft depths never verified are skipped too. Each
skipped combination is listed with its reason. Light on imports: the CLI reads the defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import product

from eaglewire.engine.spec_args import SpecArgs, spec_args_warnings
from eaglewire.errors import ConfigError

# The default grid (chains of 3, 5 and 8, trees of top-4/8/12 up to 128 nodes; invalid shapes
# skipped). On the H200 the reference target's fastest trees were 8 steps of top-8 to top-12 with
# 64-128 nodes (docs/history/benchmarks-log.md §2f, §2h, §2q, §2r), which a 1-7 steps x 4-32 nodes
# grid (59 settings) never reaches; 16-64 nodes at 3-5 steps cover what SGLang runs for 8B targets.
DEFAULT_NUM_STEPS = (3, 5, 8)
DEFAULT_TOPK = (1, 4, 8, 12)
DEFAULT_NUM_DRAFT_TOKENS = (16, 32, 64, 128)


@dataclass
class Skipped:
    setting: dict[str, int]
    reason: str


@contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def sweep_settings(
    num_steps: Sequence[int], topk: Sequence[int], num_draft_tokens: Sequence[int]
) -> tuple[list[SpecArgs], list[Skipped]]:
    """Valid, distinct settings of the grid (chains once per num_steps) and the skipped ones with reasons."""
    valid: list[SpecArgs] = []
    skipped: list[Skipped] = []
    for steps, k in product(sorted(set(num_steps)), sorted(set(topk))):
        if k == 1:
            valid.append(SpecArgs.chain(steps))
            continue
        for n in sorted(set(num_draft_tokens)):
            setting = {"num_steps": steps, "topk": k, "num_draft_tokens": n}
            try:
                with _quiet(
                    "eaglewire.engine.spec_args"
                ):  # its waste warning becomes a 'skipped' reason here
                    spec = SpecArgs(num_steps=steps, topk=k, num_draft_tokens=n)
            except ConfigError as e:
                skipped.append(Skipped(setting, str(e).splitlines()[0]))
                continue
            waste = spec_args_warnings(spec)
            if waste:
                skipped.append(Skipped(setting, waste[0]))
                continue
            valid.append(spec)
    return valid, skipped
