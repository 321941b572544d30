"""Export -> import gives identical weights and logits; exported tensor names are the engines' loader names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eaglewire.contract.contract import Contract, require_same_wiring
from eaglewire.draft.io import load_draft
from eaglewire.export import export_draft, import_draft
from eaglewire.export.keys import VOCAB_TENSORS, loader_tensors
from eaglewire.target.loading import LoadedTarget
from tests.unit.export.conftest import MakeDraft, draft_logits


def tensor_names(directory: Path) -> set[str]:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_export_import_identical_weights_and_logits(
    fmt: str, make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    src = make_draft()
    exported = export_draft(src, fmt, tmp_path / f"{fmt}-export")  # type: ignore[arg-type]
    assert tensor_names(exported.out) == loader_tensors(fmt)  # type: ignore[arg-type]
    assert {"config.json", "model.safetensors", "contract.json", f"launch_{fmt}.sh", "export.json"} <= {
        p.name for p in exported.out.iterdir()
    }

    result = import_draft(fmt, exported.out, tiny_target, tmp_path / f"{fmt}-back")  # type: ignore[arg-type]
    assert result.numbering_from in ("format", "inferred (unambiguous)", "export.json")

    before, contract_before = load_draft(src)
    after, contract_after = load_draft(result.out)
    sa, sb = before.state_dict(), after.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    for x, y in zip(draft_logits(before), draft_logits(after), strict=True):
        assert torch.equal(x, y)
    require_same_wiring(contract_before, contract_after)
    assert contract_after.fingerprint is not None
    assert contract_after.aux_boundaries == contract_before.aux_boundaries


def test_vllm_full_vocab_omits_vocab_tensors(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    """speculators writes d2t/t2d only when Vd != V (vLLM then uses the identity); SGLang always gets them."""
    src = make_draft(draft_vocab=None)
    vllm = export_draft(src, "vllm", tmp_path / "v")
    assert tensor_names(vllm.out) == loader_tensors("vllm") - set(VOCAB_TENSORS)
    sglang = export_draft(src, "sglang", tmp_path / "s")
    assert tensor_names(sglang.out) == loader_tensors("sglang")
    back = import_draft("vllm", vllm.out, tiny_target, tmp_path / "back")
    model, _ = load_draft(back.out)
    assert torch.equal(model.draft_to_target, torch.arange(tiny_target.vocab_size))


def test_bfloat16_export_rounds_only_weights(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    src = make_draft()
    exported = export_draft(src, "sglang", tmp_path / "bf16", dtype="bfloat16")
    with safe_open(str(exported.out / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
    back = import_draft("sglang", exported.out, tiny_target, tmp_path / "back")
    before, _ = load_draft(src)
    after, _ = load_draft(back.out)
    assert torch.equal(after.fc.weight, before.fc.weight.bfloat16().float())
    assert torch.equal(after.draft_to_target, before.draft_to_target)


def test_contract_is_copied(make_draft: MakeDraft, tmp_path: Path) -> None:
    src = make_draft()
    exported = export_draft(src, "vllm", tmp_path / "e")
    assert Contract.load(exported.out) == Contract.load(src)
