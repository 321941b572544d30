"""vLLM's own code, from its released package, run on our exports (issue 44, item 4).

vllm 0.33.0's config translation and model files import on a CPU machine once a few pure-Python
packages are beside it (`scripts/test_external.sh` installs them with vllm, --no-deps, into a side
folder); its model classes cannot be built without a GPU runtime, so their capture loops run on
stand-ins: decoder layers that add 1 to the residual stream, so the captured value *is* the boundary.

- `SpeculatorsConfig` reads our vLLM export as the config vLLM builds the draft from;
- both model runners' aux-layer selection returns our ids;
- the target models' `forward` captures exactly the boundaries the engine table says (boundary 0 and L,
  layer order; DeepSeek's TypeError on boundary 0), and `supports_eagle3` matches the table's rows;
- serving the export directory alone: vLLM takes the verifier only as a hub id.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from eaglewire.contract.numbering import Engine, engine_rules, read_engine_ids
from eaglewire.export import export_draft
from tests.unit.export.conftest import DRAFT_VOCAB, MakeDraft

pytestmark = pytest.mark.external

L = 8
FAMILIES = {  # architecture -> (module, model class, causal-LM class)
    "LlamaForCausalLM": ("llama", "LlamaModel", "LlamaForCausalLM"),
    "MistralForCausalLM": ("mistral", "MistralModel", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2Model", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3Model", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeModel", "Qwen3MoeForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV2Model", "DeepseekV3ForCausalLM"),
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", "Glm4MoeLiteModel", "Glm4MoeLiteForCausalLM"),
}


@pytest.fixture(scope="module")
def vllm() -> ModuleType:
    return pytest.importorskip("vllm", reason="vllm is not importable (run scripts/test_external.sh)")


def _module(name: str) -> Any:
    import importlib

    return importlib.import_module(f"vllm.model_executor.models.{name}")


def test_their_speculators_config_reads_our_export(
    vllm: ModuleType, make_draft: MakeDraft, tmp_path: Path
) -> None:
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config

    src = make_draft(boundaries=[2, 4, 8])  # boundary L: vLLM captures it
    out = export_draft(src, "vllm", tmp_path / "v", vllm_version="0.33.0", num_steps=4).out
    cfg = SpeculatorsConfig.from_pretrained(str(out))
    assert cfg.architectures == ["Eagle3LlamaForCausalLM"]
    assert cfg.eagle_aux_hidden_state_layer_ids == [2, 4, 8]
    assert cfg.norm_before_residual is False and cfg.norm_before_fc is False and cfg.fc_norm is False
    assert cfg.draft_vocab_size == DRAFT_VOCAB and cfg.num_hidden_layers == 1
    config_dict = json.loads((out / "config.json").read_text())
    assert SpeculatorsConfig.extract_vllm_speculative_config(config_dict) == {
        "method": "eagle3",
        "num_speculative_tokens": 4,
    }
    # the V2 model runner's selection, and the V1 runner's (a method: run on a stand-in runner)
    spec = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=cfg))
    assert get_eagle3_aux_layers_from_config(spec) == (2, 4, 8)  # type: ignore[arg-type]
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=spec)) == (
        2,
        4,
        8,
    )


class _Layer(nn.Module):
    """A decoder layer that adds 1 to the residual stream: after layer k the stream holds k + 1."""

    def forward(
        self, positions: torch.Tensor, h: torch.Tensor, r: torch.Tensor | None = None, *a: Any, **k: Any
    ):
        stream = h if r is None else h + r
        return torch.ones_like(stream), stream


def _captured(arch: str, ids: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> list[int] | str:
    """The boundaries vLLM's own forward captures for `ids` (or the exception it raises)."""
    module_name, model_name, causal_name = FAMILIES[arch]
    module = _module(module_name)
    model_cls, causal_cls = getattr(module, model_name), getattr(module, causal_name)
    pp = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1)
    for name in {module_name, "llama", "qwen2"}:  # Mistral/Qwen3 run their parents' forward
        monkeypatch.setattr(_module(name), "get_pp_group", lambda: pp, raising=False)
    model = model_cls.__new__(model_cls)
    nn.Module.__init__(model)
    model.layers = [_Layer() for _ in range(L)]
    model.start_layer, model.end_layer, model.hidden_size = 0, L, 4
    model.embed_tokens = lambda ids: torch.zeros(ids.shape[0], 4)
    model.norm = lambda h, r: (h + r, None)
    model.config = SimpleNamespace(llama_4_scaling=None)
    holder = causal_cls.__new__(causal_cls)
    nn.Module.__init__(holder)
    holder.model = model
    causal_cls.set_aux_hidden_state_layers(holder, ids)
    try:
        out = model_cls.forward(model, torch.zeros(3, dtype=torch.long), torch.arange(3), None)
    except TypeError as e:
        return f"TypeError: {e}"
    return [int(a[0, 0]) for a in out[1]] if isinstance(out, tuple) else []


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_their_capture_loops_capture_what_the_table_says(
    vllm: ModuleType, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.model_executor.models.interfaces import supports_eagle3

    (row,) = engine_rules(Engine.VLLM, arch, "0.33.0")
    module_name, _, causal_name = FAMILIES[arch]
    assert supports_eagle3(getattr(_module(module_name), causal_name)) == (row.numbering is not None)
    if row.numbering is None:  # GLM-4-MoE-Lite: no EAGLE-3 in vLLM 0.33.0
        return
    for ids in ((2, 4, 5), (0, 4, 8), (5, 2, 3), (3, 5, 8)):
        ours = read_engine_ids(row, ids, L)
        theirs = _captured(arch, ids, monkeypatch)
        if 0 in ids and row.embedding is not None:
            assert isinstance(theirs, str) and "TypeError" in row.embedding, theirs
            continue
        assert theirs == list(ours.boundaries or ()), (arch, ids, theirs)
        assert (ours.problem is None) == (list(ids) == sorted(ids))  # only the reordering is a problem


def test_serving_the_export_directory_alone_takes_a_hub_verifier(
    vllm: ModuleType, make_draft: MakeDraft, tmp_path: Path
) -> None:
    from vllm.transformers_utils.config import maybe_override_with_speculators

    src = make_draft()
    local = export_draft(src, "vllm", tmp_path / "local").out
    with pytest.raises(ValueError, match="must name a remote model repository"):
        maybe_override_with_speculators(model=str(local), tokenizer=None, trust_remote_code=False)
    hub = export_draft(src, "vllm", tmp_path / "hub", verifier="HuggingFaceTB/SmolLM2-135M-Instruct").out
    model, tokenizer, spec = maybe_override_with_speculators(
        model=str(hub), tokenizer=None, trust_remote_code=False
    )
    assert model == tokenizer == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert spec is not None and spec["model"] == str(hub) and spec["method"] == "eagle3"
