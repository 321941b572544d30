"""On CUDA the compiled draft round, with the fused Triton top-k inside it, still traces as one
graph and equals the eager round (tests/unit/engine/test_compiled_round.py pins the same on CPU,
where the torch top-k runs: the Triton op and where it is chosen must not break the graph).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.unit.engine.conftest import tiny  # noqa: F401  (a fixture)
from tests.unit.engine.test_compiled_round import (
    SPECS,
    check_compiled_round,
    fresh_dynamo,  # noqa: F401  (a fixture)
)

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_compiled_round_on_cuda_is_one_graph_and_matches_eager(tiny, monkeypatch, fresh_dynamo, shape):  # noqa: F811
    # a copy: the package-scoped fixture's draft stays on the CPU for the CPU tests
    check_compiled_round(copy.deepcopy(tiny.untrained).to("cuda"), SPECS[shape], monkeypatch)
