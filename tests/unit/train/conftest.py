"""Shared tiny fixtures for the training tests: a tiny Llama target, its contract, records."""

from __future__ import annotations

import pytest
import torch

from eaglewire.data.types import CapturedRecord, TokenizedRecord
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import make_peaked_target


def make_records(vocab_size: int, n: int, *, seed: int, lo: int = 14, hi: int = 30) -> list[TokenizedRecord]:
    """Random token records; the first 3 tokens of each are 'prompt' (loss_mask False)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = int(torch.randint(lo, hi, (), generator=gen))
        ids = torch.randint(3, vocab_size, (T,), generator=gen)
        mask = torch.ones(T, dtype=torch.bool)
        mask[:3] = False
        out.append(TokenizedRecord(record_id=f"rec-{seed}-{i}", input_ids=ids, loss_mask=mask))
    return out


def capture_records(target, contract, records) -> list[CapturedRecord]:
    out = []
    for r in records:
        st = capture(
            target.model, r.input_ids[None], aux_boundaries=contract.aux_boundaries, final=contract.final
        )
        out.append(CapturedRecord(r.record_id, r.input_ids, r.loss_mask, st.aux[0], st.final[0]))
    return out


@pytest.fixture(scope="session")
def tiny_target():
    """A tiny Llama target with a peaked next-token distribution (`make_peaked_target`)."""
    return make_peaked_target()


@pytest.fixture(scope="session")
def tiny_contract(tiny_target):
    return build_contract(tiny_target)


@pytest.fixture(scope="session")
def token_records(tiny_target):
    return make_records(tiny_target.vocab_size, 16, seed=1)


@pytest.fixture(scope="session")
def captured_records(tiny_target, tiny_contract, token_records):
    return capture_records(tiny_target, tiny_contract, token_records)


@pytest.fixture(scope="session")
def eval_captured(tiny_target, tiny_contract):
    return capture_records(tiny_target, tiny_contract, make_records(tiny_target.vocab_size, 4, seed=2))
