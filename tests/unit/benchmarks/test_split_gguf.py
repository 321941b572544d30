"""benchmarks/h200/split_gguf.py: as few device calls as fit, each under the limit, parts that add up."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "h200" / "split_gguf.py"
spec = importlib.util.spec_from_file_location("split_gguf", SCRIPT)
assert spec is not None and spec.loader is not None
split_gguf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(split_gguf)

MiB = 2**20
GGUF = 98_362_432  # the reference GGUF's size (eaglewire.target.reference.SMOLLM2)


@pytest.mark.parametrize(
    ("tree", "calls"),
    [(5 * MiB, 2), (12 * MiB, 2), (13.4 * MiB, 3), (25 * MiB, 3), (30 * MiB, 4)],
)
def test_fewest_calls_that_fit(tree: float, calls: int) -> None:
    wheels = int(7.9 * MiB)
    sizes = split_gguf.plan(GGUF, int(tree), wheels)
    assert len(sizes) == calls
    assert sum(sizes) == GGUF and min(sizes) > 0
    carried = [int(tree) + s + (wheels if k == 0 else 0) for k, s in enumerate(sizes)]
    assert max(carried) <= split_gguf.LIMIT - split_gguf.MARGIN
    assert max(carried) - min(carried) <= len(sizes)  # the same headroom in every call (rounding aside)


def test_a_tree_too_large_for_any_call() -> None:
    with pytest.raises(SystemExit, match="leaves no room"):
        split_gguf.plan(GGUF, 64 * MiB, 0)
