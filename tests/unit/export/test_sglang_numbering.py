"""SGLang ids by release and target architecture (the engine table), both ways through export and import.

On a DeepSeek-V3 target, SGLang before 0.5.13 adds 1 to every id and 0.5.13+ (PR #25454) only when the
first id is 1: boundaries [3, 4, 6] are ids [2, 3, 5] for the first and [3, 4, 6] for the second, so an
export without --sglang-version is refused. On a Llama target every release adds 1: no version needed,
but boundary 0 is captured only from 0.5.22 and boundary L never.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from eaglewire.errors import BoundaryError, ConfigError, ContractMismatchError
from eaglewire.export import export_draft, import_draft
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target, save_tiny_target
from tests.unit.export.conftest import MakeDraft

SPLIT = [3, 4, 6]  # DeepSeek: SGLang 0.5.10-0.5.12 ids [2, 3, 5], 0.5.13+ ids [3, 4, 6]


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> LoadedTarget:
    t = make_tiny_target("deepseek_v3", num_layers=8)
    return replace(t, path=save_tiny_target(t, tmp_path_factory.mktemp("deepseek")))


def test_deepseek_export_needs_the_release(
    make_draft: MakeDraft, deepseek: LoadedTarget, tmp_path: Path
) -> None:
    src = make_draft(target=deepseek, boundaries=SPLIT)
    with pytest.raises(BoundaryError) as e:
        export_draft(src, "sglang", tmp_path / "e")
    text = str(e.value)
    assert "SGLang 0.5.10-0.5.12 captures them from ids [2, 3, 5]" in text
    assert "SGLang 0.5.14-0.5.23 captures them from ids [3, 4, 6]" in text
    assert "--sglang-version 0.5.12" in text and "--sglang-version 0.5.23" in text
    assert not (tmp_path / "e").exists()
    # vLLM ids are boundaries in every release read
    assert export_draft(src, "vllm", tmp_path / "v").layer_ids == tuple(SPLIT)


@pytest.mark.parametrize(("version", "ids"), [("0.5.12", [2, 3, 5]), ("0.5.23", [3, 4, 6])])
def test_named_release_picks_its_ids(
    version: str, ids: list[int], make_draft: MakeDraft, deepseek: LoadedTarget, tmp_path: Path
) -> None:
    src = make_draft(target=deepseek, boundaries=SPLIT)
    result = export_draft(src, "sglang", tmp_path / version, sglang_version=version)
    cfg = json.loads((result.out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    manifest = json.loads((result.out / "export.json").read_text())
    assert manifest["engine_version"] == version and f"SGLang {version}" in result.numbering
    assert any("-> boundaries [3, 4, 6]" in r for r in manifest["read_as"])


def test_qwen3_ids_are_layer_outputs_in_every_release(make_draft: MakeDraft, tmp_path: Path) -> None:
    """The issue's case: boundaries [3, 4, 5] on a Qwen3 target; SGLang 0.5.23 adds 1 to every id."""
    qwen3 = make_tiny_target("qwen3", num_layers=8)
    qwen3 = replace(qwen3, path=save_tiny_target(qwen3, tmp_path / "qwen3"))
    src = make_draft(target=qwen3, boundaries=[3, 4, 5])
    for version in (None, "0.5.23"):
        out = tmp_path / f"e{version}"
        assert export_draft(src, "sglang", out, sglang_version=version).layer_ids == (2, 3, 4)


def test_import_reads_the_release(make_draft: MakeDraft, deepseek: LoadedTarget, tmp_path: Path) -> None:
    src = make_draft(target=deepseek, boundaries=SPLIT)
    exported = export_draft(src, "sglang", tmp_path / "e", sglang_version="0.5.12")
    # our own export.json records the release: the import follows it
    ok = import_draft("sglang", exported.out, deepseek, tmp_path / "a")
    assert ok.boundaries == tuple(SPLIT) and ok.numbering_from == "export.json"

    # a foreign export (no export.json, no contract.json): refused until the release is stated
    (exported.out / "export.json").unlink()
    (exported.out / "contract.json").unlink()
    with pytest.raises(
        BoundaryError,
        match=r"(?s)0\.5\.10-0\.5\.12 .*reads \[3, 4, 6\].*0\.5\.14-0\.5\.23 .*reads \[2, 3, 5\]",
    ):
        import_draft("sglang", exported.out, deepseek, tmp_path / "b")
    old = import_draft("sglang", exported.out, deepseek, tmp_path / "c", sglang_version="0.5.12")
    assert old.boundaries == (3, 4, 6) and old.numbering_from == "--sglang-version"
    newer = import_draft("sglang", exported.out, deepseek, tmp_path / "d", sglang_version="0.5.23")
    assert newer.boundaries == (2, 3, 5)
    rule = import_draft("sglang", exported.out, deepseek, tmp_path / "f", numbering="layer-output")
    assert rule.boundaries == (3, 4, 6) and rule.numbering_from == "stated"
    with pytest.raises(ConfigError, match="only applies to --format sglang"):
        import_draft("vllm", exported.out, deepseek, tmp_path / "g", sglang_version="0.5.23")


def test_stated_release_that_contradicts_the_contract(
    make_draft: MakeDraft, deepseek: LoadedTarget, tmp_path: Path
) -> None:
    src = make_draft(target=deepseek, boundaries=SPLIT)
    exported = export_draft(src, "sglang", tmp_path / "e", sglang_version="0.5.12")
    with pytest.raises(ContractMismatchError, match=r"(?s)aux_boundaries: .*=\[3, 4, 6\] .*=\[2, 3, 5\]"):
        import_draft("sglang", exported.out, deepseek, tmp_path / "x", sglang_version="0.5.23")


def test_default_boundaries_import_without_anything(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    exported = export_draft(make_draft(), "sglang", tmp_path / "e")
    assert exported.layer_ids[0] == 1  # every release adds 1
    for name in ("export.json", "contract.json"):
        (exported.out / name).unlink()
    back = import_draft("sglang", exported.out, tiny_target, tmp_path / "b")
    assert back.boundaries == (2, 4, 5) and back.numbering_from == "inferred (unambiguous)"


def test_boundary_zero_on_llama_only_for_releases_that_capture_it(
    make_draft: MakeDraft, tmp_path: Path
) -> None:
    src = make_draft(boundaries=[0, 3, 5])
    with pytest.raises(BoundaryError, match=r"(?s)0\.5\.10-0\.5\.21: .*TypeError.*--sglang-version 0\.5\.23"):
        export_draft(src, "sglang", tmp_path / "e")
    ok = export_draft(src, "sglang", tmp_path / "ok", sglang_version="0.5.22")
    assert ok.layer_ids == (-1, 2, 4)  # stage.py captures the embedding before layer 0
    with pytest.raises(BoundaryError, match="TypeError"):
        export_draft(src, "sglang", tmp_path / "old", sglang_version="0.5.21")


def test_boundary_l_refused_for_sglang_accepted_for_vllm(make_draft: MakeDraft, tmp_path: Path) -> None:
    src = make_draft(boundaries=[2, 4, 8])  # 8 = the tiny target's last layer output
    with pytest.raises(BoundaryError) as e:
        export_draft(src, "sglang", tmp_path / "e", sglang_version="0.5.23")
    assert "2 of its 3 aux states" in str(e.value) and "--aux-boundaries 2,4,7" in str(e.value)
    assert "eaglewire export --format vllm" in str(e.value)
    assert export_draft(src, "vllm", tmp_path / "v").layer_ids == (2, 4, 8)
