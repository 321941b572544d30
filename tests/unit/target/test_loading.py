import json

import pytest
import torch

from eaglewire.errors import TargetFilesError, UnsupportedArchitectureError
from eaglewire.target.loading import load_target
from eaglewire.target.reference import SMOLLM2, verify_gguf
from tests.helpers.tiny import make_tiny_target, save_tiny_target


def test_load_saved_directory_round_trip(tmp_path):
    tiny = make_tiny_target("qwen2")
    save_tiny_target(tiny, tmp_path)
    loaded = load_target(tmp_path, dtype="float32")
    ids = torch.randint(0, tiny.vocab_size, (1, 6))
    torch.testing.assert_close(loaded.model(ids).logits, tiny.model(ids).logits)
    assert loaded.tokenizer.chat_template == tiny.tokenizer.chat_template
    assert loaded.architecture == "Qwen2ForCausalLM"


def test_missing_directory(tmp_path):
    with pytest.raises(TargetFilesError, match="no such file"):
        load_target(tmp_path / "nope")


def test_missing_config(tmp_path):
    with pytest.raises(TargetFilesError, match="config.json missing"):
        load_target(tmp_path)


def test_missing_weights_lists_found_files(tmp_path):
    tiny = make_tiny_target("llama")
    save_tiny_target(tiny, tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(TargetFilesError, match=r"no \*\.safetensors.*pytorch_model.bin"):
        load_target(tmp_path)


def test_unknown_architecture_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForCausalLM"):
        load_target(tmp_path)


def test_gguf_hash_mismatch_is_named(tmp_path):
    bad = tmp_path / SMOLLM2.filename
    bad.write_bytes(b"x" * 10)
    with pytest.raises(TargetFilesError, match="size expected 98362432"):
        verify_gguf(bad)
    with open(bad, "wb") as f:
        f.truncate(SMOLLM2.size)
    with pytest.raises(TargetFilesError, match="sha256 expected b179c952"):
        verify_gguf(bad)
