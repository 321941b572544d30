"""Shared by the serve tests: one tiny world (target + briefly trained draft) per session, one torch thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.unit.serve.world import World, build_world


@pytest.fixture(scope="package", autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster than two fighting over two cores
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory.mktemp("serve-world"))
