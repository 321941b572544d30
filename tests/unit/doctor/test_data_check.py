"""Data vs target: every stored column is identified by values; each fault class gets its diagnosis."""

from __future__ import annotations

import pytest
import torch

from eaglewire.contract.contract import FinalState
from eaglewire.data.types import CapturedRecord
from eaglewire.doctor.data_check import check_data_against_target
from tests.unit.doctor.pipeline import labelled, make_records, tiny, tiny_hidden

L = 12
DEFAULT = (2, 6, 9)  # default_boundaries(12)


def only(findings, check):
    got = [f for f in findings if f.check == check]
    assert got, f"no {check} finding in {[f.check for f in findings]}"
    return got[0]


def test_correct_pipeline_has_no_finding():
    t = tiny(L)
    w = check_data_against_target(make_records(t, DEFAULT), labelled(t, DEFAULT), t)
    assert w.result.findings == [], [f.lines() for f in w.result.findings]
    assert w.aux_boundaries == DEFAULT
    assert w.final is not None and (w.final.boundary, w.final.norm) == (L, "pre")
    assert all(r.ok for r in w.result.rows) and len(w.result.rows) == 4


def test_shifted_layers_are_caught_with_the_relabel_fix():
    t = tiny(L)
    shifted = (3, 7, 10)  # SGLang ids [2, 6, 9] captured the "+1" way, labelled as boundaries
    w = check_data_against_target(make_records(t, shifted), labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.aux")
    assert "1 boundary deeper than in its label" in f.what
    assert f.declared == "aux_boundaries [2, 6, 9]" and f.actual == "values are [3, 7, 10]"
    assert "eaglewire data relabel --data DATA_DIR" in f.fix and "--aux-boundaries 3,7,10" in f.fix
    assert "SGLang [2, 6, 9]" in f.fix  # a Llama target: every SGLang release adds 1
    assert w.aux_boundaries == shifted


def test_swapped_order():
    t = tiny(L)
    w = check_data_against_target(make_records(t, (6, 2, 9)), labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.aux")
    assert "different order (swapped columns)" in f.what
    assert "--aux-boundaries 6,2,9" in f.fix


def test_extra_embedding_column():
    t = tiny(L)
    w = check_data_against_target(make_records(t, (0, *DEFAULT)), labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.aux")
    assert "extra embedding column (boundary 0)" in f.what
    assert w.aux_boundaries == (0, *DEFAULT)


def test_missing_embedding_column():
    t = tiny(L)
    w = check_data_against_target(make_records(t, DEFAULT), labelled(t, (0, *DEFAULT)), t)
    f = only(w.result.findings, "data.aux")
    assert "the embedding column is missing" in f.what
    assert any(r.item == "aux[3]" and r.actual == "(no such column)" for r in w.result.rows)


def test_post_norm_final_labelled_pre_norm():
    t = tiny(L)
    recs = make_records(t, DEFAULT, FinalState(L, "post"))
    w = check_data_against_target(recs, labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.final")
    assert "final state is post-norm, the label says pre-norm" in f.what
    assert "--aux-boundaries 2,6,9 --final-norm post" in f.fix and "data capture --final-norm pre" in f.fix
    assert not any(f.check == "data.aux" for f in w.result.findings)


def test_bf16_capture_declared_float32_is_a_precision_finding():
    t32, t16 = tiny(L), tiny(L, "bfloat16")
    recs = [
        CapturedRecord(r.record_id, r.input_ids, r.loss_mask, r.aux.float(), r.final.float())
        for r in make_records(t16, DEFAULT)
    ]
    w = check_data_against_target(recs, labelled(t32, DEFAULT), t32)
    f = only(w.result.findings, "data.dtype")
    assert "only to low precision" in f.what
    assert "bfloat16" in f.fix
    assert not any(f.check in ("data.aux", "data.final") for f in w.result.findings)
    # the same data, truthfully labelled bfloat16, is fine
    w = check_data_against_target(recs, labelled(t32, DEFAULT, dtype="bfloat16"), t32)
    assert w.result.findings == []


def test_stored_in_less_precision_than_declared():
    t = tiny(L)
    recs = make_records(t, DEFAULT, store_dtype=torch.bfloat16)
    w = check_data_against_target(recs, labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.dtype")
    assert "stored in less precision" in f.what and f.actual == "stored bfloat16"
    assert not any(f.check == "data.aux" for f in w.result.findings)


def test_truncated_states():
    t = tiny(L)
    recs = make_records(t, DEFAULT)
    r = recs[0]
    recs[0] = CapturedRecord(r.record_id, r.input_ids, r.loss_mask, r.aux[:30], r.final[:30])
    w = check_data_against_target(recs, labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.length")
    assert f.declared == "input_ids/loss_mask T=40" and f.actual == "aux T=30, final T=30"
    assert not any(f.check == "data.aux" for f in w.result.findings)  # the stored prefix still matches


def test_truncated_width():
    t = tiny(L)
    recs = [
        CapturedRecord(r.record_id, r.input_ids, r.loss_mask, r.aux[:, :-5], r.final)
        for r in make_records(t, DEFAULT)
    ]
    w = check_data_against_target(recs, labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.aux_width")
    assert "187" in f.actual and "192" in f.declared


def test_data_from_another_target():
    w = check_data_against_target(make_records(tiny(L), DEFAULT), labelled(tiny(L), DEFAULT), tiny(8))
    f = only(w.result.findings, "data.target.num_layers")
    assert f.declared.startswith("num_layers=12") and f.actual.startswith("num_layers=8")


def test_states_matching_no_boundary():
    t = tiny(L)
    recs = [
        CapturedRecord(r.record_id, r.input_ids, r.loss_mask, torch.randn_like(r.aux), r.final)
        for r in make_records(t, DEFAULT)
    ]
    w = check_data_against_target(recs, labelled(t, DEFAULT), t)
    f = only(w.result.findings, "data.aux")
    assert "match no boundary" in f.what and "recapture" in f.fix
    assert w.aux_boundaries is None


def test_field_report_61_layers_labelled_embedding_layer3_layer31():
    """The field reports exactly: a 61-layer target, states at boundaries 3/31/59 (SGLang's [2, 30, 58]
    read the +1 way), labelled "embedding, layer 3, layer 31" with "layer 59" as the final state."""
    t = tiny_hidden(61, 32)
    recs = make_records(t, (3, 31, 59), n=2, length=24)
    w = check_data_against_target(recs, labelled(t, (0, 3, 31), FinalState(59, "pre")), t, max_records=2)
    aux = only(w.result.findings, "data.aux")
    assert "one column off: the data has no embedding column" in aux.what and "field reports" in aux.what
    assert aux.actual == "values are [3, 31, 59]"
    assert "--aux-boundaries 3,31,59" in aux.fix and "SGLang [2, 30, 58]" in aux.fix
    final = only(w.result.findings, "data.final")
    assert final.actual.startswith("boundary 61")
    rows = {r.item: r for r in w.result.rows}
    assert rows["aux[0]"].declared == "boundary 0 (embedding output)"
    assert rows["aux[0]"].actual == "boundary 3 (output of layer 2)"


def test_field_report_scaled_to_12_layers():
    """Same construction relative to L: SGLang ids = default boundaries (2, 6, 9) read +1 -> (3, 7, 10)."""
    t = tiny(L)
    w = check_data_against_target(
        make_records(t, (3, 7, 10)), labelled(t, (0, 3, 7), FinalState(10, "pre")), t
    )
    assert "one column off" in only(w.result.findings, "data.aux").what
    assert w.aux_boundaries == (3, 7, 10)


def test_every_architecture_no_false_alarm_and_shift_caught():
    from tests.helpers.tiny import ARCHITECTURES, make_tiny_target

    for arch in ARCHITECTURES:
        t = make_tiny_target(arch, num_layers=8)
        right = (2, 4, 5)  # default_boundaries(8)
        ok = check_data_against_target(make_records(t, right, n=2, length=16), labelled(t, right), t)
        assert ok.result.findings == [], (arch, [f.lines() for f in ok.result.findings])
        bad = check_data_against_target(make_records(t, (3, 5, 6), n=2, length=16), labelled(t, right), t)
        assert [f.check for f in bad.result.findings] == ["data.aux"], arch
        assert bad.aux_boundaries == (3, 5, 6), arch


@pytest.mark.parametrize("numbering", ["specforge", "modelopt", "layer-output", "pr25454", "vllm", "eagle"])
def test_every_numbering_in_the_design_table_read_as_boundaries(numbering):
    """A tool's ids [2, 6, 9] (L=12) captured with its own meaning, labelled as if they were boundaries:
    caught exactly when the tool's meaning differs from boundaries."""
    from eaglewire.contract.numbering import Numbering, to_boundaries

    t = tiny(L)
    n = Numbering(numbering)
    ids = None if n is Numbering.EAGLE else DEFAULT
    captured = to_boundaries(ids, n, L)
    w = check_data_against_target(make_records(t, captured, n=2, length=24), labelled(t, DEFAULT), t)
    assert w.aux_boundaries == captured
    if captured == DEFAULT:  # vLLM, speculators, the PR #25454 rule (first id != 1) and EAGLE's defaults
        assert w.result.findings == []
    else:  # SpecForge, ModelOpt, the layer-output rule: output of layer i = boundary i + 1
        (f,) = w.result.findings
        assert "1 boundary deeper" in f.what and f"--aux-boundaries {','.join(map(str, captured))}" in f.fix
