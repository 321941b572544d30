"""benchmarks/h200/draft_parts.py: a draft packed without its embedding (bf16 parts) and rebuilt from the target."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eaglewire.draft.init import init_draft
from eaglewire.draft.io import WEIGHTS_FILE, load_draft, save_draft
from eaglewire.errors import CheckpointError
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import make_tiny_target, save_tiny_target

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "h200" / "draft_parts.py"


@pytest.fixture(scope="module")
def draft_parts() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("draft_parts", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny target's directory and a draft for it (trained-looking: every weight perturbed)."""
    root = tmp_path_factory.mktemp("draft_parts")
    target = make_tiny_target("llama")
    contract = build_contract(target)
    draft = init_draft(target, contract, draft_to_target=list(range(0, target.vocab_size, 2)))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name != "embed_tokens.weight":
                p.add_(torch.randn_like(p) * 0.01)
    save_draft(draft, contract, root / "draft")
    (root / "draft" / "best_setting.json").write_text(json.dumps({"num_steps": 3, "topk": 1}))
    save_tiny_target(target, root / "target")
    return root / "target", root / "draft"


def test_pack_unpack_round_trip(draft_parts: ModuleType, saved: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, draft_dir = saved
    # 40 KiB parts: lm_head [192, 64] (24 KiB in bf16) does not fit beside the manifest (~15 KiB) and splits
    paths = draft_parts.pack(draft_dir, tmp_path / "parts", max_mib=40 / 1024)
    assert len(paths) > 1
    assert all(p.stat().st_size <= 40 * 1024 for p in paths)
    assert all(p.name.replace("_", "").replace(".", "").isalnum() for p in paths)
    stored: list[str] = []
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            manifest = json.loads(f.metadata()["eaglewire_draft_parts"])  # each part holds all of it
            stored += f.keys()
    assert manifest["parts"] == [p.name for p in paths]
    assert "embed_tokens.weight" not in stored
    assert manifest["split_dim0"], "a tensor should have been split along dim 0"
    assert "lm_head.weight" in manifest["cast_to_bf16"] and "draft_to_target" in manifest["kept_dtype"]
    assert set(manifest["files"]) == {"config.json", "contract.json", "best_setting.json"}

    out = draft_parts.unpack(tmp_path / "parts", target_dir, tmp_path / "rebuilt")
    original = load_file(str(draft_dir / WEIGHTS_FILE))
    rebuilt = load_file(str(out / WEIGHTS_FILE))
    assert set(rebuilt) == set(original)
    for name, t in original.items():
        assert rebuilt[name].dtype == t.dtype, name
        if name == "embed_tokens.weight" or not t.is_floating_point():
            assert torch.equal(rebuilt[name], t), name
        else:
            assert torch.equal(rebuilt[name], t.to(torch.bfloat16).to(t.dtype)), name
    for name in ("config.json", "contract.json", "best_setting.json"):
        assert (out / name).read_text() == (draft_dir / name).read_text()
    model, contract = load_draft(out)
    assert model.config.draft_vocab_size == len(original["draft_to_target"])

    with pytest.raises(CheckpointError, match="already holds a draft"):
        draft_parts.unpack(tmp_path / "parts", target_dir, tmp_path / "rebuilt")


def test_wrong_target_names_the_embedding_mismatch(
    draft_parts: ModuleType, saved: tuple[Path, Path], tmp_path: Path
) -> None:
    _, draft_dir = saved
    other_target = make_tiny_target("llama", seed=1)
    other = save_tiny_target(other_target, tmp_path / "other_target")
    other_sha = draft_parts.tensor_sha256(other_target.model.get_input_embeddings().weight.float())
    draft_parts.pack(draft_dir, tmp_path / "parts")
    with safe_open(str(tmp_path / "parts" / "draft_part0.safetensors"), framework="pt") as f:
        packed_sha = json.loads(f.metadata()["eaglewire_draft_parts"])["embed"]["sha256"]
    with pytest.raises(CheckpointError, match="embed_tokens.weight") as err:
        draft_parts.unpack(tmp_path / "parts", other, tmp_path / "rebuilt")
    assert packed_sha != other_sha
    assert (
        packed_sha in str(err.value) and other_sha in str(err.value) and "train_embeddings" in str(err.value)
    )
    assert not (tmp_path / "rebuilt" / WEIGHTS_FILE).exists()


def test_missing_part_is_named(draft_parts: ModuleType, saved: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, draft_dir = saved
    paths = draft_parts.pack(draft_dir, tmp_path / "parts", max_mib=40 / 1024)
    paths[-1].unlink()
    with pytest.raises(CheckpointError, match=paths[-1].name):
        draft_parts.unpack(tmp_path / "parts", target_dir, tmp_path / "rebuilt")
