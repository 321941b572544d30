"""Broken engine exports: every error names the tensor or key, the expected and the actual value."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.errors import CheckpointError, ConfigError
from eaglewire.export import export_draft, import_draft
from eaglewire.target.loading import LoadedTarget
from tests.unit.export.conftest import MakeDraft


@pytest.fixture
def exported(make_draft: MakeDraft, tmp_path: Path) -> Callable[[str], Path]:
    def run(fmt: str) -> Path:
        out = export_draft(make_draft(), fmt, tmp_path / f"{fmt}-export").out  # type: ignore[arg-type]
        for name in ("contract.json", "export.json"):
            (out / name).unlink()  # a foreign export has neither
        return out

    return run


def edit_tensors(directory: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


def edit_config(directory: Path, edit: Callable[[dict], None]) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    edit(cfg)
    (directory / "config.json").write_text(json.dumps(cfg))


def test_missing_tensor(exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path) -> None:
    src = exported("sglang")
    edit_tensors(src, lambda t: t.pop("midlayer.mlp.up_proj.weight"))
    with pytest.raises(
        CheckpointError, match=r"tensor 'midlayer.mlp.up_proj.weight' missing \(expected shape \(128, 64\)\)"
    ):
        import_draft("sglang", src, tiny_target, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_wrong_shape(exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path) -> None:
    src = exported("vllm")
    edit_tensors(src, lambda t: t.update({"fc.weight": t["fc.weight"][:, :128].contiguous()}))
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'fc.weight': expected shape \(64, 192\) = \[H, A\*Ht\].*got \(64, 128\)",
    ):
        import_draft("vllm", src, tiny_target, tmp_path / "out")


def test_unexpected_tensor(
    exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    src = exported("vllm")
    edit_tensors(src, lambda t: t.update({"layers.1.hidden_norm.weight": torch.ones(64)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['layers.1.hidden_norm.weight'\]"):
        import_draft("vllm", src, tiny_target, tmp_path / "out")


def test_vllm_rejects_model_prefix_sglang_accepts_it(
    exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    for fmt in ("sglang", "vllm"):
        src = exported(fmt)
        edit_tensors(src, lambda t: t.update({"model.fc.weight": t.pop("fc.weight")}))
        if fmt == "sglang":
            import_draft(fmt, src, tiny_target, tmp_path / "ok")  # SGLang's loader strips "model."
        else:
            with pytest.raises(
                CheckpointError, match="tensor 'model.fc.weight': vLLM's loader adds the 'model.' prefix"
            ):
                import_draft(fmt, src, tiny_target, tmp_path / "bad")


def test_lost_vocab_map(exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path) -> None:
    src = exported("sglang")
    edit_tensors(
        src, lambda t: t.update({"d2t": torch.zeros_like(t["d2t"]), "t2d": torch.zeros_like(t["t2d"])})
    )
    with pytest.raises(
        CheckpointError, match="'d2t' is all zeros while draft_vocab_size=200 < vocab_size=384"
    ):
        import_draft("sglang", src, tiny_target, tmp_path / "out")


def test_vocab_mismatch(exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path) -> None:
    src = exported("vllm")
    edit_config(src, lambda c: c["transformer_layer_config"].update({"vocab_size": 500}))
    with pytest.raises(ConfigError, match=r"vocab_size \(the target's V\): expected 384, got 500"):
        import_draft("vllm", src, tiny_target, tmp_path / "out")


def test_target_hidden_mismatch(
    exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    src = exported("sglang")
    edit_config(src, lambda c: c.update({"target_hidden_size": 96}))
    with pytest.raises(ConfigError, match=r"target_hidden_size \(the target's Ht\): expected 64, got 96"):
        import_draft("sglang", src, tiny_target, tmp_path / "out")


@pytest.mark.parametrize(
    ("fmt", "key", "value", "pattern"),
    [
        (
            "sglang",
            "architectures",
            ["LlamaForCausalLMEagle"],
            r"architectures: expected \['LlamaForCausalLMEagle3'\], got \['LlamaForCausalLMEagle'\]",
        ),
        (
            "vllm",
            "architectures",
            ["Eagle3LlamaForCausalLM"],
            r"architectures: expected \['Eagle3Speculator'\], got \['Eagle3LlamaForCausalLM'\]",
        ),
        (
            "vllm",
            "speculators_model_type",
            "eagle",
            r"speculators_model_type: expected 'eagle3', got 'eagle'",
        ),
        ("vllm", "norm_before_residual", None, r"norm_before_residual absent: vLLM reads it as true"),
        ("vllm", "norm_before_residual", True, r"norm_before_residual: expected false, got True"),
        ("vllm", "draft_vocab_size", None, r"draft_vocab_size: expected an integer, got None"),
        ("sglang", "tie_word_embeddings", True, r"tie_word_embeddings is true"),
        ("sglang", "num_hidden_layers", 2, r"num_hidden_layers: expected 1, got 2"),
        ("sglang", "model_type", "qwen3", r"model_type: expected 'llama', got 'qwen3'"),
        (
            "sglang",
            "fc_norm",
            True,
            r"fc_norm: expected false or absent, got True: sglang \(0\.5\.12 on\) builds",
        ),
        ("sglang", "norm_output", True, r"norm_output: expected false or absent, got True"),
    ],
)
def test_bad_config_values(
    fmt: str,
    key: str,
    value: object,
    pattern: str,
    exported: Callable[[str], Path],
    tiny_target: LoadedTarget,
    tmp_path: Path,
) -> None:
    src = exported(fmt)
    edit_config(src, lambda c: c.pop(key) if value is None else c.update({key: value}))
    with pytest.raises(ConfigError, match=pattern):
        import_draft(fmt, src, tiny_target, tmp_path / "out")  # type: ignore[arg-type]


def test_sglang_ids_only_top_level(
    exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    src = exported("sglang")
    edit_config(
        src,
        lambda c: c.update(
            {"eagle_aux_hidden_state_layer_ids": c.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]}
        ),
    )
    with pytest.raises(ConfigError, match="top-level eagle_aux_hidden_state_layer_ids without eagle_config"):
        import_draft("sglang", src, tiny_target, tmp_path / "out")


def test_pickle_checkpoint_is_refused(
    exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    src = exported("sglang")
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(
        CheckpointError, match=r"(?s)pickle format \(pytorch_model.bin\).*never unpickles.*fix:.*save_file"
    ):
        import_draft("sglang", src, tiny_target, tmp_path / "out")


def test_unknown_format(exported: Callable[[str], Path], tiny_target: LoadedTarget, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"--format: expected one of \['sglang', 'vllm', 'eagle'\], got 'trtllm'"
    ):
        import_draft("trtllm", exported("sglang"), tiny_target, tmp_path / "out")  # type: ignore[arg-type]
