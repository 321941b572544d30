"""SGLang ids two SGLang generations read differently: refused unless the generation is named, both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.errors import BoundaryError, ContractMismatchError
from eaglewire.export import export_draft, import_draft
from eaglewire.target.loading import LoadedTarget
from tests.unit.export.conftest import MakeDraft

# On 8 layers: outputs of layers 2, 3, 5. Legacy SGLang ids [2, 3, 5]; SGLang with PR #25454 reads
# [2, 3, 5] as boundaries (the +1 applies only when the first id is 1): ambiguous.
AMBIGUOUS = [3, 4, 6]


def test_export_refuses_ambiguous_ids_without_generation(make_draft: MakeDraft, tmp_path: Path) -> None:
    src = make_draft(boundaries=AMBIGUOUS)
    with pytest.raises(BoundaryError, match=r"(?s)read as \[3, 4, 6\].*as \[2, 3, 5\].*--sglang-generation"):
        export_draft(src, "sglang", tmp_path / "e")
    assert not (tmp_path / "e").exists()
    # vLLM ids are boundaries: nothing ambiguous there
    assert export_draft(src, "vllm", tmp_path / "v").layer_ids == tuple(AMBIGUOUS)


@pytest.mark.parametrize(("generation", "ids"), [("legacy", [2, 3, 5]), ("pr25454", [3, 4, 6])])
def test_named_generation_picks_its_ids(
    generation: str, ids: list[int], make_draft: MakeDraft, tmp_path: Path
) -> None:
    src = make_draft(boundaries=AMBIGUOUS)
    result = export_draft(src, "sglang", tmp_path / generation, sglang_generation=generation)
    cfg = json.loads((result.out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert f"sglang-{generation}" in result.numbering
    assert json.loads((result.out / "export.json").read_text())["sglang_generation"] == generation


def test_import_of_ambiguous_ids(make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path) -> None:
    src = make_draft(boundaries=AMBIGUOUS)
    exported = export_draft(src, "sglang", tmp_path / "e", sglang_generation="legacy")
    # our own export.json records the generation: the import follows it
    ok = import_draft("sglang", exported.out, tiny_target, tmp_path / "a")
    assert ok.boundaries == tuple(AMBIGUOUS) and ok.numbering_from == "export.json"

    # a foreign export (no export.json, no contract.json): refused until the numbering is stated
    (exported.out / "export.json").unlink()
    (exported.out / "contract.json").unlink()
    with pytest.raises(
        BoundaryError, match=r"(?s)before PR #25454 read boundaries \[3, 4, 6\].*with it read \[2, 3, 5\]"
    ):
        import_draft("sglang", exported.out, tiny_target, tmp_path / "b")
    legacy = import_draft("sglang", exported.out, tiny_target, tmp_path / "c", numbering="sglang-legacy")
    assert legacy.boundaries == (3, 4, 6) and legacy.numbering_from == "stated"
    newer = import_draft("sglang", exported.out, tiny_target, tmp_path / "d", numbering="sglang-pr25454")
    assert newer.boundaries == (2, 3, 5)


def test_stated_numbering_that_contradicts_the_contract(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    src = make_draft(boundaries=AMBIGUOUS)
    exported = export_draft(src, "sglang", tmp_path / "e", sglang_generation="legacy")
    with pytest.raises(ContractMismatchError, match=r"(?s)aux_boundaries: .*=\[3, 4, 6\] .*=\[2, 3, 5\]"):
        import_draft("sglang", exported.out, tiny_target, tmp_path / "x", numbering="sglang-pr25454")


def test_default_boundaries_import_without_anything(
    make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    exported = export_draft(make_draft(), "sglang", tmp_path / "e")
    assert exported.layer_ids[0] == 1  # both generations add 1
    for name in ("export.json", "contract.json"):
        (exported.out / name).unlink()
    back = import_draft("sglang", exported.out, tiny_target, tmp_path / "b")
    assert back.boundaries == (2, 4, 5) and back.numbering_from == "inferred (unambiguous)"
