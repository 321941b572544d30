"""Exports name their target so they load from any working directory: an absolute path (or a hub id given
with --verifier) in speculators_config.verifier and in both launch scripts."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from eaglewire.draft.io import load_draft
from eaglewire.errors import ConfigError
from eaglewire.export import export_draft, import_draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget, load_target
from tests.helpers.tiny import save_tiny_target
from tests.unit.export.conftest import MakeDraft, draft_logits


def _launch_argv(path: Path) -> list[str]:
    line = next(x for x in path.read_text().splitlines() if x.startswith("exec "))
    return shlex.split(line[len("exec ") :])[:-1]


def test_export_from_a_relative_target_loads_from_another_directory(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    save_tiny_target(tiny_target, work / "models" / "target")
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    src = make_draft()
    sg = export_draft(src, "sglang", Path("out/sg"), target_path="models/target")
    vl = export_draft(src, "vllm", Path("out/vl"), target_path="models/target")

    monkeypatch.chdir(elsewhere)  # the relative path typed above means nothing from here
    absolute = str((work / "models" / "target").resolve())
    cfg = json.loads((work / "out/vl/config.json").read_text())
    verifier = cfg["speculators_config"]["verifier"]["name_or_path"]
    assert verifier == absolute == vl.verifier
    sg_argv = _launch_argv(work / "out/sg/launch_sglang.sh")
    assert sg_argv[sg_argv.index("--model-path") + 1] == absolute
    assert sg_argv[sg_argv.index("--speculative-draft-model-path") + 1] == str((work / "out/sg").resolve())
    vl_argv = _launch_argv(work / "out/vl/launch_vllm.sh")
    assert vl_argv[2] == absolute and json.loads(vl_argv[4])["model"] == str((work / "out/vl").resolve())
    assert sg.out == Path("out/sg")

    # the recorded config reaches the target (what speculators' load_verifier_weights reads first) ...
    assert AutoConfig.from_pretrained(verifier).num_hidden_layers == tiny_target.num_layers
    # ... and our own loader serves the export with the target found by the recorded path alone
    target = load_target(verifier, dtype="float32")
    back = import_draft("vllm", work / "out/vl", target, elsewhere / "back")
    assert back.contract.target.name == absolute
    before, _ = load_draft(src)
    after, _ = load_draft(back.out)
    for x, y in zip(draft_logits(before), draft_logits(after), strict=True):
        assert torch.equal(x, y)


def test_relative_target_that_does_not_exist_here(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    src = make_draft()
    with pytest.raises(ConfigError, match=r"(?s)not a directory from .*--target-path.*--verifier"):
        export_draft(src, "vllm", tmp_path / "v", target_path="models/missing")
    assert not (tmp_path / "v").exists()
    # a model hub id is written as given, and the launch command serves it
    hub = export_draft(src, "vllm", tmp_path / "hub", verifier="HuggingFaceTB/SmolLM2-135M-Instruct")
    cfg = json.loads((hub.out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert _launch_argv(hub.launch_file)[2] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(ConfigError, match="neither a directory here nor a model hub id"):
        export_draft(src, "vllm", tmp_path / "bad", verifier="../models/x")
    with pytest.raises(ConfigError, match="--verifier .* only applies to --format vllm"):
        export_draft(src, "sglang", tmp_path / "sg", verifier="org/name")
    # SGLang's export carries no target: its launch script keeps a path it cannot resolve, as given
    sg = export_draft(src, "sglang", tmp_path / "sg", target_path="models/missing")
    argv = _launch_argv(sg.launch_file)
    assert argv[argv.index("--model-path") + 1] == "models/missing"


def test_contract_target_name_is_resolved(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    """Without --target-path the contract's target (a directory here) is written absolute."""
    contract = build_contract(tiny_target)
    assert Path(contract.target.name).is_absolute()
    exported = export_draft(make_draft(), "vllm", tmp_path / "v")
    assert exported.verifier == str(Path(contract.target.name).resolve())
