"""config.json of each export: the keys the engine reads, with the right values and layer ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.errors import ConfigError
from eaglewire.export import export_draft
from eaglewire.export.keys import (
    ENGINE_NUM_AUX,
    IDS_KEY,
    LLAMA_LAYER_KEYS,
    SGLANG_CONFIG_KEYS,
    SGLANG_EAGLE_CONFIG_KEYS,
    SPECULATORS_CONFIG_KEYS,
    SPECULATORS_SPEC_KEYS,
    SPECULATORS_VERIFIER_KEYS,
)
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target
from tests.unit.export.conftest import DRAFT_VOCAB, MakeDraft


@pytest.fixture(scope="module")
def target_30() -> LoadedTarget:
    """Same depth as the reference SmolLM2 (L = 30), tiny widths."""
    return make_tiny_target("llama", num_layers=30)


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def test_sglang_config_for_30_layers(make_draft: MakeDraft, target_30: LoadedTarget, tmp_path: Path) -> None:
    src = make_draft(target=target_30)
    result = export_draft(src, "sglang", tmp_path / "sg")
    cfg = read_config(result.out)
    assert set(cfg) >= SGLANG_CONFIG_KEYS
    assert set(cfg["eagle_config"]) == SGLANG_EAGLE_CONFIG_KEYS
    # default boundaries [2, 15, 27] = outputs of layers 1, 14, 26: SGLang ids, read alike by both generations
    assert cfg["eagle_config"][IDS_KEY] == [1, 14, 26] == list(result.layer_ids)
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert IDS_KEY not in cfg  # SGLang reads only the nested key
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["num_hidden_layers"] == 1
    assert cfg["vocab_size"] == target_30.vocab_size
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["target_hidden_size"] == target_30.hidden_size
    assert cfg["tie_word_embeddings"] is False  # else SGLang would use the embedding as lm_head
    assert cfg["model_type"] == "llama"
    assert result.boundaries == (2, 15, 27)


def test_vllm_config_for_30_layers(make_draft: MakeDraft, target_30: LoadedTarget, tmp_path: Path) -> None:
    src = make_draft(target=target_30)
    result = export_draft(src, "vllm", tmp_path / "vl", target_path="/models/smol", num_steps=5)
    cfg = read_config(result.out)
    assert set(cfg) >= SPECULATORS_CONFIG_KEYS
    assert cfg[IDS_KEY] == [2, 15, 27] == list(result.layer_ids)  # boundary numbering, top-level
    assert "eagle_config" not in cfg
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["architectures"] == ["Eagle3Speculator"]
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["target_hidden_size"] == target_30.hidden_size
    assert cfg["norm_before_residual"] is False  # vLLM reads an absent key as True
    layer = cfg["transformer_layer_config"]
    assert set(layer) >= LLAMA_LAYER_KEYS
    assert layer["vocab_size"] == target_30.vocab_size  # the target's vocabulary, not Vd
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1
    spec = cfg["speculators_config"]
    assert set(spec) == SPECULATORS_SPEC_KEYS
    assert set(spec["verifier"]) == SPECULATORS_VERIFIER_KEYS
    assert spec["verifier"] == {"name_or_path": "/models/smol", "architectures": ["LlamaForCausalLM"]}
    assert spec["algorithm"] == "eagle3"
    assert spec["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 5}]
    assert spec["default_proposal_method"] == "greedy"


def test_engines_read_three_aux_states(make_draft: MakeDraft, tmp_path: Path) -> None:
    """vLLM 0.33.0 builds fc = target_hidden_size * 3 for a speculators config (so did sglang 0.5.10-0.5.11):
    other counts are refused before writing."""
    src = make_draft(boundaries=[2, 4, 5, 6])
    assert ENGINE_NUM_AUX != 4
    for fmt in ("sglang", "vllm"):
        with pytest.raises(ConfigError, match="reads 4 aux states.*exactly 3"):
            export_draft(src, fmt, tmp_path / fmt)  # type: ignore[arg-type]
        assert not (tmp_path / fmt).exists()
