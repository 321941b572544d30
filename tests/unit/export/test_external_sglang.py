"""SGLang's own code, from its released packages, run on our ids and our export (issue 44, item 4).

sglang does not import on a CPU machine (its import chain needs triton, apache-tvm-ffi, sgl kernels and a
torchvision built for the installed torch), so `scripts/test_external.sh` installs each release with
`pip install --no-deps --target` into a side folder and names the folders in EAGLEWIRE_EXTERNAL_SGLANG
("0.5.12=/path,0.5.23=/path"). The functions that decide what we rely on are compiled alone from the
installed files (their file name and line numbers kept, nothing copied here) and run on stand-ins for
the objects around them:

- `set_eagle3_layers_to_capture` of every architecture's causal-LM class: the capture points SGLang
  derives from our ids equal the engine table's reading, release by release;
- the model files' capture loops, read for the facts the table cites (the loop's range, the unguarded
  `hidden_states + residual` that crashes on boundary 0 in older releases);
- `LlamaForCausalLMEagle3.load_weights` on our SGLang export: every tensor lands on a parameter of
  SGLang's draft with the shape its modules build, none dropped; hot_token_id equals our vocab map.
"""

from __future__ import annotations

import ast
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eaglewire.contract.numbering import Engine, _apply, default_boundaries, engine_rules
from eaglewire.draft.io import load_draft
from eaglewire.export import export_draft
from tests.unit.export.conftest import MakeDraft

pytestmark = pytest.mark.external

L = 8
# architecture -> (model file, the class whose set_eagle3_layers_to_capture it runs)
CAUSAL_LM = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": (
        "llama",
        "LlamaForCausalLM",
    ),  # mistral.py: class MistralForCausalLM(LlamaForCausalLM)
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
}
# the model classes whose forward holds the capture loop
MODEL = {
    "llama": "LlamaModel",
    "qwen2": "Qwen2Model",
    "qwen3": "Qwen3Model",
    "qwen2_moe": "Qwen2MoeModel",
    "deepseek_v2": "DeepseekV2Model",
    "glm4_moe_lite": "Glm4MoeLiteModel",
}
IDS = ([1, 3, 4], [2, 3, 4], [3, 4, 5], [-1, 2, 4], [0, 3, 5], [1, 3, 7], [4, 1, 2], None)


def _sites() -> dict[str, Path]:
    spec = os.environ.get("EAGLEWIRE_EXTERNAL_SGLANG", "")
    out = {}
    for item in filter(None, spec.split(",")):
        version, _, path = item.partition("=")
        out[version] = Path(path)
    return out


SITES = _sites()
needs_sglang = pytest.mark.skipif(
    not SITES, reason="EAGLEWIRE_EXTERNAL_SGLANG not set (scripts/test_external.sh)"
)


def _classes(site: Path, module: str) -> tuple[Path, str, dict[str, ast.ClassDef]]:
    path = site / "sglang" / "srt" / "models" / f"{module}.py"
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    return path, source, {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _method(site: Path, module: str, cls: str, name: str) -> Callable[..., Any] | None:
    """SGLang's own method, compiled alone from the installed file (None when the class does not define it)."""
    path, _, classes = _classes(site, module)
    node = next((f for f in classes[cls].body if isinstance(f, ast.FunctionDef) and f.name == name), None)
    if node is None:
        return None
    node.decorator_list = []
    namespace: dict[str, Any] = {
        **{
            n: vars(typing)[n] for n in ("Optional", "List", "Iterable", "Tuple")
        },  # the names their signatures use
        "torch": torch,
        "default_weight_loader": _no_weight_loader,
    }
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def _no_weight_loader(param: Any, weight: torch.Tensor, *shard: Any) -> None:
    raise AssertionError(
        f"a parameter without its own weight_loader got a tensor of shape {tuple(weight.shape)}"
    )


def _base_names(site: Path, module: str, cls: str) -> list[str]:
    _, _, classes = _classes(site, module)
    return [ast.unparse(b) for b in classes[cls].bases]


def _set_layers(site: Path, arch: str) -> Callable[[list[int] | None], list[int]]:
    """A stand-in model whose set_eagle3_layers_to_capture is SGLang's; returns the capture points it sets."""
    module, cls = CAUSAL_LM[arch]
    fn = _method(site, module, cls, "set_eagle3_layers_to_capture")
    if fn is None:  # GLM-4-MoE-Lite before 0.5.13 inherits DeepSeek's
        assert _base_names(site, module, cls) == ["DeepseekV2ForCausalLM"], _base_names(site, module, cls)
        fn = _method(site, "deepseek_v2", "DeepseekV2ForCausalLM", "set_eagle3_layers_to_capture")
        assert fn is not None

    def run(ids: list[int] | None) -> list[int]:
        layers = [SimpleNamespace() for _ in range(L)]
        model = SimpleNamespace(layers=layers, layers_to_capture=[])
        if arch == "Qwen3MoeForCausalLM":  # the inner Qwen2MoeModel flags each layer
            inner = _method(site, "qwen2_moe", "Qwen2MoeModel", "set_eagle3_layers_to_capture")
            assert inner is not None
            model.set_eagle3_layers_to_capture = types.MethodType(inner, model)
        this = SimpleNamespace(
            pp_group=SimpleNamespace(is_last_rank=True),
            config=SimpleNamespace(num_hidden_layers=L),
            model=model,
        )
        fn(this, ids)
        assert this.capture_aux_hidden_states is True
        return list(model.layers_to_capture)

    return run


@needs_sglang
@pytest.mark.parametrize("version", sorted(SITES))
@pytest.mark.parametrize("arch", list(CAUSAL_LM))
def test_their_id_rule_is_the_tables(version: str, arch: str) -> None:
    site = SITES[version]
    if arch == "MistralForCausalLM":
        assert _base_names(site, "mistral", "MistralForCausalLM")[0] == "LlamaForCausalLM"
    if arch == "DeepseekV3ForCausalLM":
        assert _base_names(site, "deepseek_v2", "DeepseekV3ForCausalLM") == ["DeepseekV2ForCausalLM"]
    (row,) = engine_rules(Engine.SGLANG, arch, version)
    assert row.numbering is not None
    theirs = _set_layers(site, arch)
    for ids in IDS:
        ours = list(default_boundaries(L) if ids is None else _apply(ids, row.numbering))
        if (
            arch == "Qwen3MoeForCausalLM" and L in ours
        ):  # self.layers[L]: the startup IndexError the row cites
            assert row.last_layer is not None and "IndexError" in row.last_layer
            with pytest.raises(IndexError):
                theirs(ids)
            continue
        assert theirs(ids) == ours, (version, arch, ids)


@needs_sglang
@pytest.mark.parametrize("version", sorted(SITES))
@pytest.mark.parametrize("arch", list(CAUSAL_LM))
def test_their_capture_loops_say_what_the_rows_cite(version: str, arch: str) -> None:
    site = SITES[version]
    (row,) = engine_rules(Engine.SGLANG, arch, version)
    module = {"MistralForCausalLM": "llama", "DeepseekV3ForCausalLM": "deepseek_v2"}.get(
        arch, CAUSAL_LM[arch][0]
    )
    if arch == "Qwen3MoeForCausalLM":
        module = "qwen2_moe"
    _, source, classes = _classes(site, module)
    model = MODEL[module]
    forward = next(
        (f for f in classes[model].body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None
    )
    if forward is None:  # Qwen3Model used Qwen2Model's, GLM-4-MoE-Lite's model DeepseekV2Model's
        base = _base_names(site, module, model)[0]
        module = {"Qwen2Model": "qwen2", "DeepseekV2Model": "deepseek_v2"}[base]
        _, source, classes = _classes(site, module)
        forward = next(
            f for f in classes[base].body if isinstance(f, ast.FunctionDef) and f.name == "forward"
        )
    text = ast.get_source_segment(source, forward) or ""
    assert (
        "range(self.start_layer, self.end_layer)" in text
        or "range(normal_start_layer, normal_end_layer)" in text
    )
    assert "in self.layers_to_capture" in text or "_is_layer_to_capture" in text
    assert row.last_layer is not None  # no release read captures boundary L
    crashes = "aux_hidden_states.append(hidden_states + residual)" in text
    assert crashes == (row.embedding is not None), (version, arch, row.embedding)


@needs_sglang
@pytest.mark.parametrize("version", sorted(SITES))
def test_their_draft_loader_takes_every_tensor_of_our_export(
    version: str, make_draft: MakeDraft, tmp_path: Path
) -> None:
    site = SITES[version]
    src = make_draft()
    exported = export_draft(src, "sglang", tmp_path / "sglang", sglang_version=version)
    cfg = load_draft(src)[0].config
    H, Ht, I_, hd = cfg.hidden_size, cfg.target_hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    ids = exported.layer_ids
    # SGLang's draft modules (models/llama_eagle3.py, llama.py): fc is target_hidden_size * num_aux wide
    # (num_aux = len(eagle_config ids)), layer 0's qkv reads 2H (embedding and hidden concatenated)
    shards: dict[str, dict[Any, tuple[int, ...]]] = {
        "model.embed_tokens.weight": {None: (cfg.vocab_size, H)},
        "model.fc.weight": {None: (H, Ht * len(ids))},
        "model.layers.0.self_attn.qkv_proj.weight": {"q": (q, 2 * H), "k": (kv, 2 * H), "v": (kv, 2 * H)},
        "model.layers.0.self_attn.o_proj.weight": {None: (H, q)},
        "model.layers.0.mlp.gate_up_proj.weight": {0: (I_, H), 1: (I_, H)},
        "model.layers.0.mlp.down_proj.weight": {None: (H, I_)},
        "model.layers.0.input_layernorm.weight": {None: (H,)},
        "model.layers.0.hidden_norm.weight": {None: (H,)},
        "model.layers.0.post_attention_layernorm.weight": {None: (H,)},
        "model.norm.weight": {None: (H,)},
        "lm_head.weight": {None: (cfg.draft_vocab_size, H)},
    }
    got: dict[str, dict[Any, tuple[int, ...]]] = {}

    def loader(name: str) -> Callable[..., None]:
        def load(_param: Any, weight: torch.Tensor, shard: Any = None) -> None:
            got.setdefault(name, {})[shard] = tuple(weight.shape)

        return load

    params = {n: SimpleNamespace(weight_loader=loader(n)) for n in shards}
    this = SimpleNamespace(named_parameters=lambda: params.items(), hot_token_id=None)
    load_weights = _method(site, "llama_eagle3", "LlamaForCausalLMEagle3", "load_weights")
    assert load_weights is not None
    load_weights(this, load_file(str(exported.out / "model.safetensors")).items())
    assert got == shards  # every parameter filled, each shard with the shape SGLang's module has
    ours, _ = load_draft(src)
    assert torch.equal(this.hot_token_id, ours.draft_to_target)  # hot_token_id = d2t + arange(Vd)
