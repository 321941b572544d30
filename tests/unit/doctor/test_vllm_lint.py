"""vLLM lint: top-level ids are boundaries; nested SGLang ids are misread; greedy drafting at T > 0."""

from __future__ import annotations

import json

import pytest

from eaglewire.doctor.vllm_lint import lint_vllm, load_vllm_config
from eaglewire.errors import ConfigError
from tests.unit.doctor.pipeline import tiny, write_sglang_config, write_speculators_config

TRAINED = (3, 31, 59)


def spec(model, **extra):
    return {
        "speculative_config": {"method": "eagle3", "model": str(model), "num_speculative_tokens": 3},
        **extra,
    }


def test_speculators_export_with_boundary_ids_is_fine(tmp_path):
    d = write_speculators_config(tmp_path / "v", list(TRAINED), target=tiny(12))
    lint = lint_vllm(spec(d), draft=None, num_layers=61, trained=TRAINED)
    assert lint.result.findings == []
    assert lint.readings[0].boundaries == TRAINED


def test_sglang_ids_served_by_vllm_are_misread(tmp_path):
    d = write_sglang_config(tmp_path / "s", [2, 30, 58], target=tiny(12))
    lint = lint_vllm(spec(d), draft=None, num_layers=61, trained=TRAINED)
    assert [r.boundaries for r in lint.readings] == [
        (2, 30, 58),
        (2, 30, 58),
    ]  # nested read as boundaries; defaults
    assert len(lint.result.findings) == 2
    for f in lint.result.findings:
        assert "1 boundary shallower" in f.what
        assert '"eagle_aux_hidden_state_layer_ids": [3, 31, 59] at the top level' in f.fix


def test_greedy_drafting_at_positive_temperature_is_flagged(tmp_path):
    d = write_speculators_config(tmp_path / "v", list(TRAINED), target=tiny(12))
    lint = lint_vllm(spec(d, temperature=0.7), draft=None, num_layers=61, trained=TRAINED)
    (f,) = lint.result.findings
    assert f.check == "serving.vllm.temperature" and f.severity == "warning"
    assert "drafts greedily" in f.what


@pytest.mark.parametrize(
    ("speculative", "check"),
    [
        ({"method": "eagle", "num_speculative_tokens": 3}, "serving.vllm.method"),
        ({"method": "eagle3"}, "serving.vllm.num_speculative_tokens"),
    ],
)
def test_method_and_length(speculative, check):
    lint = lint_vllm({"speculative_config": speculative}, draft=None, num_layers=None, trained=None)
    assert [f.check for f in lint.result.findings] == [check]


def test_config_file_errors(tmp_path):
    p = tmp_path / "c.json"
    p.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_vllm_config(p)
    p.write_text(json.dumps({"temperature": 0.5}))
    with pytest.raises(ConfigError, match="no speculative config keys"):
        load_vllm_config(p)
    p.write_text("{bad json")
    with pytest.raises(ConfigError, match=r"c\.json:1:2: invalid JSON"):
        load_vllm_config(p)
    p.write_text(json.dumps({"method": "eagle3", "num_speculative_tokens": 2}))
    assert load_vllm_config(p)["method"] == "eagle3"


def test_vllm_release_rows_per_architecture(tmp_path):
    """vLLM 0.33.0 captures boundary 0 on Llama targets but crashes on it on DeepSeek ones, and sorts the ids."""
    d = write_speculators_config(tmp_path / "v", [0, 4, 8], target=tiny(12))
    ok = lint_vllm(spec(d), draft=None, num_layers=12, trained=(0, 4, 8), architecture="LlamaForCausalLM")
    assert ok.result.findings == [] and ok.readings[0].label == "vLLM 0.33.0"
    bad = lint_vllm(
        spec(d), draft=None, num_layers=12, trained=(0, 4, 8), architecture="DeepseekV3ForCausalLM"
    )
    (f,) = bad.result.findings
    assert f.check == "serving.vllm.layer_ids" and "TypeError" in f.actual
    d2 = write_speculators_config(tmp_path / "w", [8, 0, 4], target=tiny(12))
    lint = lint_vllm(spec(d2), draft=None, num_layers=12, trained=(8, 0, 4), architecture="LlamaForCausalLM")
    assert lint.readings[0].boundaries == (0, 4, 8) and "layer order" in (lint.readings[0].problem or "")
