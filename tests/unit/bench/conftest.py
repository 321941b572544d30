"""Shared fixtures: a tiny random Llama target and an untrained EAGLE-3 draft saved for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglewire.bench.prompts import BenchPrompt, PromptSet
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target


@pytest.fixture(scope="package")
def tiny_target() -> LoadedTarget:
    return make_tiny_target("llama", num_layers=4)


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
