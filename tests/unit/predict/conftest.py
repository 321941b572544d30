"""Shared fixtures of the prediction tests: the bench's tiny random Llama target with an untrained draft,
the training tests' peaked target with held-out records, and `served_tiny`: a draft trained on a tiny
target's own greedy answers (chains and trees then accept several tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from eaglewire.bench.prompts import BenchPrompt, PromptSet, encode_prompt
from eaglewire.contract.contract import Contract
from eaglewire.data.types import CapturedRecord, TokenizedRecord
from eaglewire.draft.init import init_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import CORPUS, make_peaked_target, make_tiny_target
from tests.helpers.tiny_bench import draft_dir, one_cpu_thread, tiny_target, two_prompts
from tests.unit.engine.conftest import Tiny, plain_greedy, train_draft
from tests.unit.train.conftest import capture_records, make_records

__all__ = ["draft_dir", "one_cpu_thread", "tiny_target", "two_prompts"]  # the shared fixtures, re-exported


@pytest.fixture(scope="package")
def peaked_target() -> LoadedTarget:
    """A tiny Llama target with a peaked next-token distribution (`make_peaked_target`)."""
    return make_peaked_target()


@pytest.fixture(scope="package")
def peaked_contract(peaked_target: LoadedTarget) -> Contract:
    return build_contract(peaked_target)


@pytest.fixture(scope="package")
def token_records(peaked_target: LoadedTarget) -> list[TokenizedRecord]:
    return make_records(peaked_target.vocab_size, 16, seed=1)


@pytest.fixture(scope="package")
def eval_captured(peaked_target: LoadedTarget, peaked_contract: Contract) -> list[CapturedRecord]:
    return capture_records(peaked_target, peaked_contract, make_records(peaked_target.vocab_size, 4, seed=2))


@dataclass(frozen=True)
class ServedTiny:
    """A tiny target, three chat prompts, the target's greedy answer to each, and a draft trained on
    those answers (it agrees with the target often, so chains and trees accept several tokens)."""

    target: LoadedTarget
    contract: Contract
    prompts: PromptSet
    ids: list[list[int]]  # each prompt's chat-templated ids
    greedy: list[list[int]]  # the target's greedy answer to each, `answer_tokens` long
    draft: Eagle3Draft


def served_tiny(answer_tokens: int) -> ServedTiny:
    target = make_tiny_target("llama", num_layers=4)
    contract = build_contract(target, (1, 2, 3))
    prompts = PromptSet("tiny", tuple(BenchPrompt(f"p{i}", (("user", t),)) for i, t in enumerate(CORPUS[:3])))
    ids = [encode_prompt(target.tokenizer, p) for p in prompts.prompts]
    greedy = [plain_greedy(target.model, p, answer_tokens) for p in ids]
    draft = train_draft(Tiny(target, contract, init_draft(target, contract), ids, greedy))
    return ServedTiny(target, contract, prompts, ids, greedy, draft)
