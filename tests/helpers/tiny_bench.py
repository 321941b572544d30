"""Fixtures the bench and prediction tests share (their conftests import them): a tiny random Llama
target, an untrained EAGLE-3 draft saved for it, and two prompts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eaglewire.bench.prompts import BenchPrompt, PromptSet
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target


@pytest.fixture(scope="package", autouse=True)
def one_cpu_thread() -> Iterator[None]:
    """Tiny matmuls on a loaded 2-core machine: intra-op threads only add contention (10-100x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def tiny_target() -> LoadedTarget:
    return make_tiny_target("llama")


@pytest.fixture(scope="package")
def draft_dir(tiny_target: LoadedTarget, tmp_path_factory: pytest.TempPathFactory) -> Path:
    contract = build_contract(tiny_target)
    draft = init_draft(tiny_target, contract, seed=0)
    return save_draft(draft, contract, tmp_path_factory.mktemp("draft") / "draft")


@pytest.fixture(scope="package")
def two_prompts() -> PromptSet:
    return PromptSet(
        "tiny",
        (
            BenchPrompt("greeting", (("user", "Hello! How are you today?"),)),
            BenchPrompt("code", (("system", "You write Python."), ("user", "def add(a, b):"))),
        ),
    )
