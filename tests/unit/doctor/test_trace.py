"""--trace: every tensor crossing target -> draft inside the engine, with shapes, norms and leading values."""

from __future__ import annotations

import json

import torch

from eaglewire.contract.numbering import describe_boundary
from eaglewire.doctor.trace import encode_prompt, run_trace, trace_text
from eaglewire.draft.init import init_draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.target.capture import capture
from tests.unit.doctor.pipeline import labelled, tiny

PROMPT = "Hello! How are you today?"


def test_trace_follows_the_engine_stage_by_stage():
    t = tiny(12)
    contract = labelled(t, (2, 6, 9))
    draft = init_draft(t, contract).eval()
    stages = run_trace(t, draft, contract, PROMPT, spec=SpecArgs.chain(2), max_new_tokens=3)
    by = {(s["stage"], s["tensor"]): s for s in stages}
    ids = encode_prompt(t, PROMPT)
    n = len(ids) - 1  # the engine prefills all but the newest prompt token
    # prefill: each aux column with its boundary, and their concatenation
    assert by[("target.prefill", "input_ids")]["shape"] == [1, n]
    for i, b in enumerate((2, 6, 9)):
        s = by[("target.prefill", f"aux[{i}]")]
        assert s["shape"] == [1, n, 64] and s["boundary"] == b and s["meaning"] == describe_boundary(b, 12)
    assert by[("target.prefill", "aux (concatenated)")]["shape"] == [1, n, 192]
    # the recorded values are the real captured ones
    full = capture(t.model, torch.tensor([ids[:n]]), aux_boundaries=[6], final=contract.final)
    expected = [round(float(v), 6) for v in full.aux[0, -1, :5]]
    assert by[("target.prefill", "aux[1]")]["leading_last"] == expected
    # the draft gets those rows, paired with the next tokens, then fc maps A*Ht -> H
    assert by[("draft.extend0", "aux rows given to the draft")]["shape"] == [n, 192]
    assert by[("draft.extend0", "tokens paired with them")]["values_last"] == ids[1:][-5:]
    assert by[("draft.extend0", "fc(aux)")]["shape"] == [1, n, 64]
    # a chain of 2: one tree of root + 2 drafts, verified by the target, rows committed, fed back
    assert by[("draft.tree0", "tree tokens (root first)")]["shape"] == [3]
    assert by[("target.verify1", "aux (concatenated)")]["shape"] == [1, 3, 192]
    accepted = by[("target.commit1", "accepted rows")]["rows"]
    assert by[("draft.extend1", "aux rows given to the draft")]["shape"] == [len(accepted), 192]
    summary = by[("summary", "generation")]
    assert len(summary["generated"]) == 3 and summary["spec"] == [2, 1, 3]
    lines = trace_text(stages)
    assert len(lines) == len(stages)
    assert any(
        line.startswith("[target.prefill] aux[0] shape=[1, ") and "norm(mean)=" in line for line in lines
    )
    for s in stages:
        json.loads(json.dumps(s))
