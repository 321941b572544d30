"""Draft vs target: identity, fingerprint, vocabulary map (absolute and the engines' d2t/t2d), fc width."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.doctor.draft_check import check_draft
from eaglewire.doctor.draft_source import read_draft_source
from eaglewire.doctor.export_check import check_export
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.export.exporting import export_draft
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target
from tests.unit.doctor.pipeline import labelled, rewrite_marker, tiny

DEFAULT = (2, 6, 9)
VD = 100


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    """An eaglewire draft with a 100-token vocabulary map, and its SGLang and vLLM exports."""
    t = tiny(12)
    root = tmp_path_factory.mktemp("drafts")
    contract = labelled(t, DEFAULT, fingerprint=True)
    d2t = torch.randperm(t.vocab_size, generator=torch.Generator().manual_seed(0))[:VD].sort().values
    save_draft(init_draft(t, contract, draft_to_target=d2t), contract, root / "ew")
    export_draft(root / "ew", "sglang", root / "sglang")
    export_draft(root / "ew", "vllm", root / "vllm", target_path="/models/tiny")  # an absolute verifier path
    return {"ew": root / "ew", "sglang": root / "sglang", "vllm": root / "vllm"}


def checks(result):
    return [f.check for f in result.findings]


@pytest.mark.parametrize("kind", ["ew", "sglang", "vllm"])
def test_matching_draft_has_no_finding(drafts, kind):
    src = read_draft_source(drafts[kind])
    assert src.kind == {"ew": "eaglewire", "sglang": "sglang", "vllm": "vllm"}[kind]
    result = check_draft(src, target=tiny(12))
    assert result.findings == [], [f.lines() for f in result.findings]
    if kind == "ew":
        assert any(r.item == "fc.weight in_features" and r.ok for r in result.rows)
    else:  # an export's fc width is read the engine's way (fc = target_hidden_size * 3): the export check
        export = check_export(src, target=tiny(12), trained=DEFAULT, trained_from="the draft's contract")
        assert export.result.findings == [], [f.lines() for f in export.result.findings]
        assert any(r.item == "target_hidden_size" and r.ok for r in export.result.rows)


def test_fingerprint_catches_another_checkpoint_of_the_same_architecture(drafts):
    other = make_tiny_target("llama", num_layers=12, seed=1)  # same config and tokenizer, other weights
    result = check_draft(read_draft_source(drafts["ew"]), target=other)
    assert set(checks(result)) == {"draft.fingerprint"}
    assert "not its declared boundary" in result.findings[0].what


def test_identity_catches_another_chat_template(drafts):
    t = tiny(12)
    tok = copy.deepcopy(t.tokenizer)
    tok.chat_template = "{{ messages[0]['content'] }}"
    result = check_draft(read_draft_source(drafts["ew"]), target=LoadedTarget(t.model, tok, t.path))
    assert checks(result) == ["draft.target.chat_template_hash"]
    assert "chat template" in result.findings[0].fix


def test_identity_catches_another_target_shape(drafts):
    result = check_draft(read_draft_source(drafts["ew"]), target=tiny(8))
    assert "draft.target.num_layers" in checks(result)
    assert "draft.fingerprint" not in checks(result)  # not attempted on another shape


def test_draft_and_data_contracts_disagree(drafts):
    t = tiny(12)
    result = check_draft(read_draft_source(drafts["ew"]), data_contract=labelled(t, (3, 7, 10)))
    (f,) = result.findings
    assert f.check == "draft.vs_data_contract" and "aux_boundaries" in f.what
    assert f.declared == "draft [2, 6, 9]" and f.actual == "data [3, 7, 10]"


def _tamper(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    tensors = load_file(str(path))
    for name, fn in changes.items():
        key = next(
            k for k in tensors if k == name.replace("__", ".") or k.endswith("." + name.replace("__", "."))
        )
        tensors[key] = fn(tensors[key])
    save_file(tensors, str(path))
    rewrite_marker(dst)
    return dst


def test_d2t_holding_absolute_ids(drafts, tmp_path):
    d = _tamper(drafts["sglang"], tmp_path / "abs", d2t=lambda d2t: d2t + torch.arange(len(d2t)))
    result = check_draft(read_draft_source(d), target=tiny(12))
    (f,) = result.findings
    assert f.check == "draft.vocab_map" and "absolute target ids; engines read offsets" in f.what


def test_all_zero_d2t(drafts, tmp_path):
    d = _tamper(drafts["sglang"], tmp_path / "zero", d2t=torch.zeros_like)
    (f,) = check_draft(read_draft_source(d), target=tiny(12)).findings
    assert "all zeros" in f.what


def test_t2d_count_differs_from_vd(drafts, tmp_path):
    def extra(t2d):
        t2d = t2d.clone()
        t2d[int((~t2d).nonzero()[0, 0])] = True  # one more target id than the draft can emit
        return t2d

    d = _tamper(drafts["vllm"], tmp_path / "t2d", t2d=extra)
    (f,) = check_draft(read_draft_source(d), target=tiny(12)).findings
    assert "t2d disagrees with d2t" in f.what and f.actual == f"{VD + 1} true of 384"


def test_fc_width_differs_from_a_times_ht(drafts, tmp_path):
    d = _tamper(drafts["ew"], tmp_path / "fc", fc__weight=lambda w: w[:, :128].contiguous())
    result = check_draft(read_draft_source(d), target=tiny(12))
    (f,) = result.findings
    assert f.check == "draft.fc_width" and f.actual == "fc.weight in_features = 128"
    assert f.declared == "A*Ht = 3*64 = 192"


def test_export_fc_width_differs_from_three_times_target_hidden_size(drafts, tmp_path):
    d = _tamper(drafts["sglang"], tmp_path / "fc", fc__weight=lambda w: w[:, :128].contiguous())
    export = check_export(read_draft_source(d), target=tiny(12), trained=DEFAULT, trained_from="contract")
    assert [f.check for f in export.result.findings] == [
        "export.sglang.fc_width",
        "export.sglang.fc_width_vs_contract",
    ]
    f = export.result.findings[0]
    assert f.actual == f"{d}: fc.weight in_features = 128 (= 2 aux states)"
    assert "3 * 64 = 192" in f.declared


@pytest.mark.parametrize(("kind", "severity"), [("sglang", "error"), ("ew", "warning"), ("vllm", None)])
def test_a_trained_embedding_is_flagged_where_sglang_would_replace_it(drafts, tmp_path, kind, severity):
    """SGLang serves the target's embedding in place of the draft's (hidden sizes equal); vLLM serves the draft's."""
    bad = tmp_path / kind
    shutil.copytree(drafts[kind], bad)
    weights = next(bad.glob("*.safetensors"))
    state = load_file(str(weights))
    name = next(k for k in state if k.endswith("embed_tokens.weight"))
    state[name] = state[name] + 0.5 * state[name].std() * torch.randn_like(state[name])  # as if trained
    save_file(state, str(weights))
    rewrite_marker(bad)
    result = check_draft(read_draft_source(bad), target=tiny(12))
    found = [f for f in result.findings if f.check == "draft.embedding"]
    row = next(r for r in result.rows if r.item == "embed_tokens vs target embedding")
    assert 0.45 < float(row.actual.rsplit(" ", 1)[1]) < 0.55  # the noise added: half the std
    if severity is None:
        assert found == [] and row.ok
    else:
        assert [f.severity for f in found] == [severity]
        assert "SGLang replaces it" in found[0].what and "vLLM" in found[0].fix
