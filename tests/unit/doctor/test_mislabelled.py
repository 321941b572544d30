"""Issue 43 item 5: "this data is mislabelled" vs "this draft was trained on mislabelled data".

The data's labels say X = [2, 6, 9]; its columns are really Y = [3, 7, 10]. Two drafts have a contract
saying X, built on the live target (so their fingerprints match it): one learned X (trained on correctly
labelled data), one learned Y (trained on this data). Labels and fingerprints cannot tell them apart;
their own step-0 accuracy under both wirings can. The doctor must never advise changing the first.
"""

from __future__ import annotations

import pytest

from eaglewire.doctor.draft_source import read_draft_source
from eaglewire.doctor.run import diagnose
from eaglewire.doctor.standalone import Accuracy, WiringVerdict
from eaglewire.doctor.wiring_verdict import boundaries_trained_on, wiring_verdict_findings
from eaglewire.draft.io import save_draft
from eaglewire.export.exporting import export_draft
from eaglewire.target.identity import build_contract
from tests.unit.doctor.pipeline import mislabelled_world, tiny

L = 12
X = (2, 6, 9)
Y = (3, 7, 10)
CHAIN = "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    t = tiny(L)
    root = tmp_path_factory.mktemp("mislabelled")
    out = {}
    for name, learned in (("fine", X), ("learned", Y)):
        w = mislabelled_world(t, labels=X, stored=Y, learned=learned)
        save_draft(w.draft, w.draft_contract, root / name)
        export_draft(root / name, "sglang", root / f"{name}_sglang")
        out[name] = (w, root / name, root / f"{name}_sglang")
    return out


def run(worlds, name, *, export=False, sglang_args=True, draft_contract_dir=None):
    w, draft_dir, sglang_dir = worlds[name]
    source = read_draft_source(draft_contract_dir or (sglang_dir if export else draft_dir))
    return diagnose(
        target=tiny(L),
        records=w.records,
        data_contract=w.data_contract,
        draft_source=source,
        draft_model=w.draft,
        sglang_args=f"{CHAIN} --speculative-draft-model-path {sglang_dir}" if sglang_args else None,
        sglang_version="0.5.23",
        accuracy_labels="tokens",
    )


def by_check(report):
    return {f.check: f for f in report.findings}


@pytest.mark.parametrize("export", [False, True])
def test_mislabelled_data_and_a_good_draft_the_draft_is_left_alone(worlds, export):
    report = run(worlds, "fine", export=export)
    found = by_check(report)
    assert set(found) == {"data.aux", "draft.data_mislabelled"}, report.detail_lines()
    verdict = found["draft.data_mislabelled"]
    assert (
        "this data is mislabelled: its columns are boundaries [3, 7, 10], its labels say [2, 6, 9]"
        in verdict.what
    )
    assert "100.0%" in verdict.actual.split("with its contract's boundaries")[0]
    assert "do not change the draft" in verdict.fix
    # the data's own fix no longer tells anyone to serve the draft at the data's boundaries
    assert "train/serve" not in found["data.aux"].fix and "leave the draft as it is" in found["data.aux"].fix
    # the draft's contract matches the live target by fingerprint, and nothing asks to change it
    draft_rows = next(c for c in report.checks if c.name == "draft vs target").rows
    assert all(r.ok for r in draft_rows if r.item.startswith("fingerprint"))
    assert not any(
        f.check.startswith(("serving.", "export.", "standalone.", "draft.contract")) for f in report.findings
    )
    standalone = next(c for c in report.checks if c.name == "draft vs data")
    assert standalone.rows[0].declared == "contract's boundaries [2, 6, 9] (recaptured)"


def test_a_draft_trained_on_mislabelled_data_gets_its_wiring_corrected(worlds):
    report = run(worlds, "learned")
    found = by_check(report)
    f = found["draft.contract_vs_data_values"]
    assert (
        "this draft was trained on mislabelled data: it learned the data's real boundaries [3, 7, 10]"
        in f.what
    )
    assert "100.0% (104/104) on the data's columns [3, 7, 10]" in f.actual
    assert (
        "correct its wiring to aux_boundaries [3, 7, 10]" in f.fix
        and "eaglewire draft relabel --draft " in f.fix
        and "--aux-boundaries 3,7,10 --out " in f.fix
        and "and relabel the data: eaglewire data relabel --data " in f.fix
    )
    # serving is judged against what the draft really reads: its export (ids for [2, 6, 9]) is wrong
    ids = found["serving.sglang.layer_ids"]
    assert "(the training data's values)" in ids.declared and "[2, 6, 9]" in ids.fix
    assert "standalone.accuracy_gap" in found
    assert "draft.data_mislabelled" not in found


def test_a_draft_whose_contract_is_the_datas_values_is_fine(worlds, tmp_path):
    """Labels wrong, draft trained on the real boundaries with a contract saying so: only the data is named."""
    w, _, _ = worlds["learned"]
    save_draft(w.draft, build_contract(tiny(L), Y), tmp_path / "right")
    report = run(worlds, "learned", sglang_args=False, draft_contract_dir=tmp_path / "right")
    found = by_check(report)
    assert set(found) == {"data.aux"}, report.detail_lines()
    assert "a draft trained on this data learned exactly those" in found["data.aux"].fix
    draft = next(c for c in report.checks if c.name == "draft vs target")
    assert any("the data's labels [2, 6, 9] are wrong" in n for n in draft.notes)


def test_a_good_draft_checked_against_other_correct_data_is_not_silenced(worlds):
    """Data labelled right ([3, 7, 10]) and a draft that reads its own [2, 6, 9]: not its data, still a finding."""
    w, draft_dir, _ = worlds["fine"]
    report = diagnose(
        target=tiny(L),
        records=w.records,
        data_contract=build_contract(tiny(L), Y),
        draft_source=read_draft_source(draft_dir),
        draft_model=w.draft,
        accuracy_labels="tokens",
    )
    found = by_check(report)
    assert set(found) == {"draft.vs_data_contract"}, report.detail_lines()
    assert "check the draft against the data it was trained on" in found["draft.vs_data_contract"].fix


def verdict(contract_pct, stored_pct, total=100):
    return WiringVerdict(Y, X, Accuracy(stored_pct, total), Accuracy(contract_pct, total), "tokens")


@pytest.mark.parametrize(
    ("contract_pct", "stored_pct", "learned"),
    [(46, 26, "contract"), (26, 46, "data"), (30, 27, "unclear"), (27, 30, "unclear")],
)
def test_which_wiring_the_draft_learned(contract_pct, stored_pct, learned):
    assert verdict(contract_pct, stored_pct).learned == learned


def test_no_measured_accuracy_is_unclear():
    assert verdict(0, 0, total=0).learned == "unclear"


def test_an_unclear_verdict_never_changes_the_draft(worlds):
    w, draft_dir, _ = worlds["fine"]
    unclear = verdict(30, 28)
    assert wiring_verdict_findings(unclear, read_draft_source(draft_dir), w.data_contract, L) == []
    assert boundaries_trained_on(Y, w.draft_contract, w.data_contract, unclear) == (X, "the draft's contract")
    # without any measured accuracy, a draft's contract beats the data's values too
    assert boundaries_trained_on(Y, w.draft_contract, w.data_contract, None) == (X, "the draft's contract")
    assert boundaries_trained_on(Y, None, w.data_contract, None) == (Y, "the training data's values")
