"""The field reports, end to end on a tiny pipeline (12 layers; the 61-layer construction scaled by L).

Truth: the draft was trained on boundaries (3, 7, 10) (a dump at SGLang ids [2, 6, 9], read the
"+1" way), but the dump was labelled "embedding, layer 3, layer 7" with "layer 10" as the final
state. The draft's contract copied the labels. Then:
- the "-1 embedding fix": SGLang ids [-1, 2, 6] to match the labels -> boundary 0 (which SGLang
  releases before 0.5.22 cannot even capture on a Llama target), and standalone accuracy drops;
- the right boundaries written as ids [3, 7, 10] (read as boundaries, as PR #25454 does for DeepSeek
  targets only): every SGLang release adds 1 on a Llama target, so they arrive one boundary deeper;
- `--speculative-num-steps 1 --speculative-num-draft-tokens 16 --speculative-eagle-topk 1`;
- and the fixed pipeline, which must report nothing.
"""

from __future__ import annotations

import pytest

from eaglewire.contract.contract import FinalState
from eaglewire.doctor.draft_source import read_draft_source
from eaglewire.doctor.run import diagnose
from eaglewire.doctor.serving_common import ServedReading
from eaglewire.doctor.standalone import check_standalone
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from tests.unit.doctor.pipeline import labelled, oracle_records, tiny, write_sglang_config

L = 12
TRUE_AUX = (3, 7, 10)
LABELS = (0, 3, 7)
LABEL_FINAL = FinalState(10, "pre")
REPORT_ARGS = "--speculative-algorithm EAGLE3 --speculative-num-steps 1 --speculative-num-draft-tokens 16 --speculative-eagle-topk 1"
FIXED_ARGS = "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-num-draft-tokens 4 --speculative-eagle-topk 1"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    t = tiny(L)
    draft = init_draft(t, labelled(t, TRUE_AUX)).eval()
    records = oracle_records(t, draft, TRUE_AUX, n=4, length=32)
    root = tmp_path_factory.mktemp("field")
    mislabelled = labelled(t, LABELS, LABEL_FINAL)
    save_draft(draft, mislabelled, root / "draft")
    return {"target": t, "draft": draft, "records": records, "labels": mislabelled, "root": root}


def run(world, ids, args, *, version=None, relabelled=False):
    t = world["target"]
    sgl = write_sglang_config(world["root"] / f"sgl_{'_'.join(map(str, ids))}", ids, target=t)
    contract = labelled(t, TRUE_AUX) if relabelled else world["labels"]
    return diagnose(
        target=t,
        records=world["records"],
        data_contract=contract,
        draft_source=None if relabelled else read_draft_source(world["root"] / "draft"),
        draft_model=world["draft"],
        sglang_args=f"{args} --speculative-draft-model-path {sgl}",
        sglang_version=version,
        accuracy_labels="tokens",
    )


def by_check(report):
    out = {}
    for f in report.findings:
        out.setdefault(f.check, []).append(f)
    return out


def test_the_minus_one_embedding_fix_is_diagnosed_with_both_accuracies(world):
    report = run(world, [-1, 2, 6], REPORT_ARGS, version="0.5.23")
    found = by_check(report)
    assert report.exit_code == 1
    # 1. the data: labels one column off, the tensors are boundaries 3/7/10
    (data,) = found["data.aux"]
    assert "no embedding column" in data.what and "--aux-boundaries 3,7,10" in data.fix
    assert "data.final" in found
    # the draft's own accuracy says it learned the data's real boundaries: its contract (the labels) is wrong
    (mis,) = found["draft.contract_vs_data_values"]
    assert "this draft was trained on mislabelled data" in mis.what
    assert "correct its wiring to aux_boundaries [3, 7, 10]" in mis.fix and "[2, 6, 9]" in mis.fix
    assert "100.0% (104/104) on the data's columns [3, 7, 10]" in mis.actual
    # 2. serving: -1 -> boundary 0 (captured by 0.5.22+ on Llama targets); the right ids are [2, 6, 9]
    (ids,) = found["serving.sglang.layer_ids"]
    assert "prepends an embedding column" in ids.what and "SGLang 0.5.23" in ids.what
    assert (
        "trained on boundaries 3 (output of layer 2)" in ids.declared
        and "(the training data's values)" in ids.declared
    )
    assert '"eagle_aux_hidden_state_layer_ids": [2, 6, 9]' in ids.fix
    # 3. the standalone test: accuracy drops, both numbers shown
    (gap,) = found["standalone.accuracy_gap"]
    assert gap.declared.startswith("trained wiring [3, 7, 10]: 100.0%")
    assert gap.actual.startswith("served wiring [0, 3, 7]: ")
    served = float(gap.actual.split(": ")[1].split("%")[0])
    assert served < 60.0
    # 4. the silent draft-length rewrite
    (rw,) = found["serving.sglang.num_draft_tokens"]
    assert "rewrites --speculative-num-draft-tokens 16 to 2" in rw.what


def test_boundaries_written_as_ids_are_one_boundary_deeper_on_llama(world):
    report = run(world, [3, 7, 10], FIXED_ARGS, relabelled=True)
    found = by_check(report)
    assert set(found) == {"serving.sglang.layer_ids", "standalone.accuracy_gap"}, report.detail_lines()
    (ids,) = found["serving.sglang.layer_ids"]
    assert "SGLang 0.5.10-0.5.23 (every release read)" in ids.what and "1 boundary deeper" in ids.what
    assert '"eagle_aux_hidden_state_layer_ids": [2, 6, 9]' in ids.fix
    (gap,) = found["standalone.accuracy_gap"]
    assert gap.actual.startswith("served wiring [4, 8, 11]") and gap.fix == ids.fix


def test_the_right_ids_and_the_relabelled_data_report_nothing(world):
    report = run(world, [2, 6, 9], FIXED_ARGS, relabelled=True)
    assert report.findings == [], report.detail_lines()
    assert report.exit_code == 0
    assert {c.name: c.status for c in report.checks} == {
        "data vs target": "ok",
        "serving: sglang": "ok",
        "draft vs data": "ok",
    }


def test_standalone_without_target_permutes_the_stored_columns(world):
    served = [ServedReading("sglang", "swapped engine", None, (7, 3, 10), fix="put the ids back in order")]
    result = check_standalone(world["draft"], world["records"], data_boundaries=TRUE_AUX, served=served)
    (f,) = result.findings
    assert f.declared.endswith("100.0% (104/104)") and f.fix == "put the ids back in order"
    assert "labels = the data's next tokens" in result.notes[-1]
