"""An export read the way its engine reads it: layer ids (by values with a target), sizes, flags, the
speculators block. Real exports of a real tiny draft, edited where a hand edit or another tool would."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eaglewire.doctor.draft_source import read_draft_source
from eaglewire.doctor.export_check import check_export
from eaglewire.doctor.run import diagnose
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.export.exporting import export_draft
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import make_tiny_target
from tests.unit.doctor.pipeline import tiny

L = 12
DEFAULT = (2, 6, 9)
SHIFTED = (3, 7, 10)  # on DeepSeek, SGLang 0.5.10-0.5.12 ids [2, 6, 9], 0.5.13+ ids [3, 7, 10]
VD = 100
CHAIN = "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    t = tiny(L)
    root = tmp_path_factory.mktemp("exports")
    contract = build_contract(t, DEFAULT)
    d2t = torch.randperm(t.vocab_size, generator=torch.Generator().manual_seed(0))[:VD].sort().values
    save_draft(init_draft(t, contract, draft_to_target=d2t), contract, root / "ew")
    export_draft(root / "ew", "sglang", root / "sglang")
    export_draft(root / "ew", "vllm", root / "vllm", target_path="/models/tiny")
    deepseek = make_tiny_target("deepseek_v3", num_layers=L)
    shifted = build_contract(deepseek, SHIFTED)
    save_draft(init_draft(deepseek, shifted), shifted, root / "ew_shifted")
    export_draft(root / "ew_shifted", "sglang", root / "sglang_0512", sglang_version="0.5.12")
    return {p.name: p for p in root.iterdir()}


def edited(src: Path, dst: Path, **changes) -> Path:
    """A copy of an export whose config.json has keys edited by hand (`a__b` is a nested key; None deletes)."""
    shutil.copytree(src, dst)
    path = dst / "config.json"
    config = json.loads(path.read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        holder = config
        for p in parents:
            holder = holder[p]
        if value is None:
            holder.pop(key, None)
        else:
            holder[key] = value
    path.write_text(json.dumps(config))
    return dst


def check(path: Path, *, target=True, trained=DEFAULT, version=None):
    return check_export(
        read_draft_source(path),
        target=tiny(L) if target else None,
        trained=trained,
        trained_from="the draft's contract",
        version=version,
    ).result


def by_check(result):
    return {f.check: f for f in result.findings}


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("with_target", [True, False])
def test_clean_export_has_no_finding(exports, kind, with_target):
    result = check(exports[kind], target=with_target)
    assert result.findings == [], [f.lines() for f in result.findings]
    assert result.name == f"export: {kind}"
    by_values = [r for r in result.rows if r.item.endswith("by values")]
    assert len(by_values) == (3 if with_target else 0) and all(r.ok for r in by_values)


def test_edited_vllm_ids_are_named_with_what_the_engine_captures_and_the_fix(exports, tmp_path):
    d = edited(exports["vllm"], tmp_path / "v", eagle_aux_hidden_state_layer_ids=list(SHIFTED))
    f = by_check(check(d))["export.vllm.layer_ids"]
    assert f.declared.startswith(f"{d / 'config.json'}: eagle_aux_hidden_state_layer_ids = [3, 7, 10]")
    assert (
        "captures boundaries 3 (output of layer 2), 7 (output of layer 6), 10 (output of layer 9)"
        in f.declared
    )
    assert "trained on boundaries 2 (output of layer 1)" in f.actual and "confirmed by values" in f.actual
    assert "every column is 1 boundary deeper" in f.what
    assert f.fix == f"set eagle_aux_hidden_state_layer_ids to [2, 6, 9] in {d / 'config.json'}"
    assert len(f.details) == 3 and all("another state" in line for line in f.details)


def test_ids_past_the_last_layer_name_the_valid_range(exports, tmp_path):
    d = edited(exports["vllm"], tmp_path / "v", eagle_aux_hidden_state_layer_ids=[100, 200, 300])
    f = by_check(check(d))["export.vllm.layer_ids"]
    assert "valid are ids naming boundaries 0..12 of this 12-layer target, in increasing order" in f.what
    assert "[100, 200, 300]" in f.declared and "name no boundary of a 12-layer target (0..12)" in f.actual
    assert "[2, 6, 9]" in f.fix
    s = edited(exports["sglang"], tmp_path / "s", eagle_config__eagle_aux_hidden_state_layer_ids=[1, 5, 12])
    f = by_check(check(s, target=False))["export.sglang.layer_ids"]
    # SGLang never captures boundary L; releases before 0.5.22 crash on boundary 0 for Llama targets
    assert "valid are ids naming boundaries 1..11 of this 12-layer target" in f.what


def test_sglang_release_from_export_json_else_each_release(exports, tmp_path):
    """A DeepSeek-V3 target: the release the export was written for (export.json) decides, else each release
    range is read and the ones that differ are findings."""
    d0 = exports["sglang_0512"]
    assert check(d0, target=False, trained=SHIFTED).findings == []  # export.json names 0.5.12
    d = tmp_path / "no_manifest"
    shutil.copytree(d0, d)
    (d / "export.json").unlink()
    result = check(d, target=False, trained=SHIFTED)
    (f,) = result.findings  # 0.5.10-0.5.12 read [2, 6, 9] as [3, 7, 10]; 0.5.13+ as [2, 6, 9]
    assert "SGLang 0.5.13-0.5.23 will feed the draft other states" in f.what
    assert "--sglang-version 0.5.12" in f.fix
    assert check(d, target=False, trained=SHIFTED, version="0.5.12").findings == []
    assert check(d, target=False, trained=SHIFTED, version="0.5.23").findings != []


def test_sizes_that_disagree_with_the_weights_or_the_target(exports, tmp_path):
    d = edited(
        exports["sglang"],
        tmp_path / "s",
        draft_vocab_size=VD + 1,
        target_hidden_size=32,
        vocab_size=500,
        num_hidden_layers=2,
        tie_word_embeddings=True,
        bias=True,
    )
    found = by_check(check(d))
    assert (
        found["export.sglang.draft_vocab_size"].fix == f"set draft_vocab_size to {VD} in {d / 'config.json'}"
    )
    assert (
        "lm_head.weight has 100 rows; d2t has 100 entries" in found["export.sglang.draft_vocab_size"].actual
    )
    assert found["export.sglang.target_hidden_size"].fix.startswith("set target_hidden_size to 64")
    assert found["export.sglang.vocab_size"].fix.startswith("set vocab_size to 384")
    assert {
        "export.sglang.num_hidden_layers",
        "export.sglang.tie_word_embeddings",
        "export.sglang.bias",
    } <= set(found)


def test_fc_width_is_three_target_hidden_sizes(exports, tmp_path):
    d = edited(
        exports["vllm"], tmp_path / "v", target_hidden_size=None, transformer_layer_config__hidden_size=32
    )
    found = by_check(check(d, target=False))
    # absent target_hidden_size is read as hidden_size (32): fc would be 96 wide, and that is not the target's
    assert "absent (read as hidden_size = 32)" in found["export.vllm.target_hidden_size"].declared
    assert "export.vllm.hidden_size" in found  # the weights' fc has 64 output rows


def test_norm_flags_read_the_engine_way(exports, tmp_path):
    v = edited(exports["vllm"], tmp_path / "v", norm_before_residual=None, norm_before_fc=True)
    found = by_check(check(v))
    assert "absent (vLLM reads it as true)" in found["export.vllm.norm_before_residual"].declared
    assert found["export.vllm.norm_before_fc"].fix == f'set "norm_before_fc": false in {v / "config.json"}'
    s = edited(exports["sglang"], tmp_path / "s", norm_before_residual=True)
    result = check(s)
    assert result.findings == []  # SGLang reads no such flag: served as trained
    assert any("ignored by SGLang" in n for n in result.notes)


def test_sglang_variant_flags_are_findings(exports, tmp_path):
    s = edited(exports["sglang"], tmp_path / "s", fc_norm=True, eagle_config__norm_before_fc=True)
    found = by_check(check(s))
    assert found["export.sglang.fc_norm"].fix == f"remove fc_norm from {s / 'config.json'}"
    assert "eagle_config.norm_before_fc = true" in found["export.sglang.norm_before_fc"].declared


def test_speculators_block(exports, tmp_path):
    d = tmp_path / "v"
    edited(exports["vllm"], d)
    config = json.loads((d / "config.json").read_text())
    config["speculators_config"]["verifier"]["architectures"] = ["Qwen3ForCausalLM"]
    config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 0
    config["transformer_layer_config"].pop("model_type")
    (d / "config.json").write_text(json.dumps(config))
    found = by_check(check(d))
    assert found["export.vllm.speculators_config.verifier"].fix.endswith(
        f'["LlamaForCausalLM"] in {d / "config.json"}'
    )
    assert "export.vllm.speculators_config.speculative_tokens" in found
    assert "Qwen3 layer" in found["export.vllm.model_type"].what


def test_a_contract_whose_fingerprint_is_another_state_is_checked_by_values(exports):
    """The contract says [2, 6, 9] but its recorded values are boundaries [3, 7, 10]: the values decide."""
    t = tiny(L)
    source = read_draft_source(exports["vllm"])
    real = build_contract(t, SHIFTED).fingerprint
    assert real is not None and source.contract is not None
    relabelled = tuple(
        replace(x, boundary=b) for x, b in zip(real.tensors, (*DEFAULT, L), strict=True)
    )  # the labels lie; the numbers are [3, 7, 10]'s
    source = replace(source, contract=replace(source.contract, fingerprint=replace(real, tensors=relabelled)))
    result = check_export(source, target=t, trained=DEFAULT, trained_from="the draft's contract").result
    f = by_check(result)["export.vllm.layer_ids"]
    assert "the draft contract's fingerprint, by values on this target" in f.actual
    assert "[3, 7, 10]" in f.fix


def test_serving_args_on_the_same_export_do_not_repeat_the_ids_finding(exports, tmp_path):
    d = edited(exports["sglang"], tmp_path / "s", eagle_config__eagle_aux_hidden_state_layer_ids=[2, 6, 9])
    report = diagnose(
        target=tiny(L),
        draft_source=read_draft_source(d),
        sglang_args=f"{CHAIN} --speculative-draft-model-path {d}",
    )
    assert [f.check for f in report.findings if f.check.endswith("layer_ids")] == ["export.sglang.layer_ids"]
    lint = next(c for c in report.checks if c.name == "serving: sglang")
    assert any("see the export check" in n for n in lint.notes)
