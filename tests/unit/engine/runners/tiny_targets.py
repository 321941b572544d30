"""Tiny targets shared by the runtime tests (built once per session: building costs ~0.2 s each)."""

from __future__ import annotations

import functools

from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target


@functools.cache
def tiny(arch: str, num_layers: int = 4) -> LoadedTarget:
    return make_tiny_target(arch, num_layers=num_layers)
