"""EAGLE official import (hard-coded boundaries, embedding from the target) and the two CLI commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.contract.numbering import default_boundaries
from eaglewire.draft.io import load_draft
from eaglewire.errors import ConfigError
from eaglewire.export import export_draft, import_draft
from eaglewire.target.architectures import target_parts
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import save_tiny_target
from tests.unit.export.conftest import MakeDraft, draft_logits


def as_eagle_official(sglang_export: Path) -> Path:
    """EAGLE's layout: plain LlamaForCausalLM config without ids, SGLang's tensor names, no embedding."""
    cfg = json.loads((sglang_export / "config.json").read_text())
    cfg.pop("eagle_config")
    cfg["architectures"] = ["LlamaForCausalLM"]
    (sglang_export / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(sglang_export / "model.safetensors"))
    tensors.pop("embed_tokens.weight")
    save_file(tensors, str(sglang_export / "model.safetensors"))
    for name in ("contract.json", "export.json", "launch_sglang.sh"):
        (sglang_export / name).unlink()
    return sglang_export


def test_eagle_official_import(make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path) -> None:
    src = make_draft()
    eagle_dir = as_eagle_official(export_draft(src, "sglang", tmp_path / "eagle").out)
    result = import_draft("eagle", eagle_dir, tiny_target, tmp_path / "back")
    assert result.layer_ids is None and result.numbering == "eagle" and result.numbering_from == "format"
    assert result.boundaries == default_boundaries(tiny_target.num_layers)
    assert any("embed_tokens.weight absent" in n for n in result.notes)
    before, _ = load_draft(src)
    after, contract = load_draft(result.out)
    assert contract.fingerprint is not None
    assert torch.equal(after.embed_tokens.weight, target_parts(tiny_target.model).embed_tokens.weight)
    with torch.no_grad():
        # EAGLE serves with the target's embedding
        before.embed_tokens.weight.copy_(after.embed_tokens.weight)
    for name, tensor in before.state_dict().items():
        assert torch.equal(tensor, after.state_dict()[name]), name
    for x, y in zip(draft_logits(before), draft_logits(after), strict=True):
        assert torch.equal(x, y)
    with pytest.raises(ConfigError, match="EAGLE's code takes no ids"):
        import_draft("eagle", eagle_dir, tiny_target, tmp_path / "x", numbering="layer-output")


def test_eagle_format_refuses_engine_exports(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    sg = export_draft(make_draft(), "sglang", tmp_path / "sg").out
    with pytest.raises(ConfigError, match="(?s)this is an SGLang export.*--format sglang"):
        import_draft("eagle", sg, tiny_target, tmp_path / "x")


def test_cli_export_then_import(make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path) -> None:
    target_dir = save_tiny_target(tiny_target, tmp_path / "target")
    src = make_draft()
    runner = CliRunner()
    exp = runner.invoke(
        app,
        [
            "export",
            "--draft",
            str(src),
            "--format",
            "vllm",
            "--out",
            str(tmp_path / "e"),
            "--target-path",
            str(target_dir),
            "--num-steps",
            "4",
        ],
    )
    assert exp.exit_code == 0, exp.output
    assert "--speculative-config" in exp.output and '"num_speculative_tokens": 4' in exp.output
    assert (tmp_path / "e" / "launch_vllm.sh").exists()
    imp = runner.invoke(
        app,
        [
            "import",
            "--format",
            "vllm",
            "--src",
            str(tmp_path / "e"),
            "--target",
            str(target_dir),
            "--out",
            str(tmp_path / "b"),
        ],
    )
    assert imp.exit_code == 0, imp.output
    assert "speculators (from format)" in imp.output
    before, _ = load_draft(src)
    after, _ = load_draft(tmp_path / "b")
    for x, y in zip(draft_logits(before), draft_logits(after), strict=True):
        assert torch.equal(x, y)


def test_cli_uncapturable_sglang_export_exits_2(make_draft: MakeDraft, tmp_path: Path) -> None:
    import subprocess
    import sys

    src = make_draft(boundaries=[2, 4, 8])  # 8 = L: no SGLang release captures the last layer's output
    cmd = [
        sys.executable,
        "-c",
        "from eaglewire.cli import main; main()",
        "export",
        "--draft",
        str(src),
        "--format",
        "sglang",
        "--out",
        str(tmp_path / "e"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--aux-boundaries 2,4,7" in proc.stderr and "eaglewire export --format vllm" in proc.stderr
    assert not (tmp_path / "e").exists()
