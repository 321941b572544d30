"""On the real reference target (SmolLM2-135M, 30 layers): adjacent mid-stack boundaries are told apart
by values across dtypes, where its attention-sink token would fool a plain L2 distance."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from eaglewire.contract.contract import FinalState
from eaglewire.data.types import CapturedRecord
from eaglewire.doctor.data_check import check_data_against_target
from eaglewire.doctor.draft_check import check_fingerprint_values
from eaglewire.doctor.findings import CheckResult
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import load_target

pytestmark = pytest.mark.slow
TEXTS = [
    "Write a short poem about the sea and explain it.",
    "def add(a, b):\n    return a + b  # what does this do?",
]


@pytest.fixture(scope="module")
def targets(smollm2):
    return load_target("smollm2", dtype="bfloat16"), smollm2


def records(target, boundaries):
    out = []
    for i, text in enumerate(TEXTS):
        ids = target.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True)[
            "input_ids"
        ]
        ids = torch.tensor(ids)
        st = capture(target.model, ids[None], aux_boundaries=boundaries, final=FinalState(30, "pre"))
        out.append(
            CapturedRecord(
                f"smollm2:{i}", ids, torch.ones_like(ids, dtype=torch.bool), st.aux[0], st.final[0]
            )
        )
    return out


def test_bf16_data_checked_on_a_float32_target(targets):
    bf16, fp32 = targets
    declared = build_contract(bf16, (2, 15, 27), fingerprint=False)
    ok = check_data_against_target(records(bf16, (2, 15, 27)), declared, fp32)
    assert ok.result.findings == [], [f.lines() for f in ok.result.findings]
    shifted = check_data_against_target(records(bf16, (3, 16, 28)), declared, fp32)
    assert [f.check for f in shifted.result.findings] == ["data.aux"]
    assert shifted.aux_boundaries == (3, 16, 28)


def test_mid_stack_fingerprint_across_dtypes(targets):
    bf16, fp32 = targets
    contract = build_contract(bf16, (12, 13, 14))
    result = CheckResult(name="t")
    check_fingerprint_values(contract, fp32, result)
    assert result.findings == [], [f.lines() for f in result.findings]
    # the same values labelled one boundary lower: every aux tensor is caught
    real = build_contract(bf16, (13, 14, 15))
    assert real.fingerprint is not None
    relabelled = [
        replace(t, boundary=b) for t, b in zip(real.fingerprint.tensors[:3], (12, 13, 14), strict=True)
    ]
    fp = replace(real.fingerprint, tensors=(*relabelled, real.fingerprint.tensors[3]))
    result = CheckResult(name="t")
    check_fingerprint_values(replace(contract, fingerprint=fp), fp32, result)
    assert [f.actual.split(" (")[0] for f in result.findings] == ["boundary 13", "boundary 14", "boundary 15"]
