"""Verdicts of `ids`, `generate --check-lossless` and `bench`, both ways."""

from __future__ import annotations

from tests.faults.harness import Case

CASES = [
    Case("ids:valid", "ids --num-layers 7 --from vllm 2,3,4", 0, says=("output of layer 1",)),
    Case(
        "ids:past-the-last-layer",
        "ids --num-layers 7 --from sglang 9,10,11",
        2,
        says=("out of range 0..7",),
    ),
]
