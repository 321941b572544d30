"""The real reference target (SmolLM2-135M-Instruct), loaded once for every slow test."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """SmolLM2 in float32 on CPU; tests only read it (capture, generate), so one load serves them all."""
    from eaglewire.target.loading import load_target

    return load_target("smollm2", dtype="float32")
