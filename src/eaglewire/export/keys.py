"""The exact tensor names and config keys each engine's EAGLE-3 loader reads (foreign names live here).

Written down from the engines' code (read, not copied). Re-check when a version changes:

- SGLang: sgl-project/sglang `python/sglang/srt/models/llama_eagle3.py` @ 03d5a7771f60
  (`LlamaForCausalLMEagle3.__init__` / `load_weights` / `set_embed_and_head`): tensors `fc.weight`,
  `midlayer.*` (q/k/v/o_proj, gate/up/down_proj, input_layernorm, hidden_norm,
  post_attention_layernorm), `norm.weight`, `lm_head.weight`, `embed_tokens.weight`, a `model.`
  prefix optional; `d2t` (hot_token_id = d2t + arange) and `t2d` (skipped). Names it does not know
  are dropped silently. `fc` is `target_hidden_size * 3` wide (a literal 3). Config:
  `draft_vocab_size` (None = load lm_head from the target), `tie_word_embeddings`,
  `target_hidden_size`; the draft's embedding is replaced by the target's whenever
  `target_hidden_size == hidden_size`. `eagle_config.eagle_aux_hidden_state_layer_ids` and
  `eagle_config.use_aux_hidden_state` are read in `model_executor/model_runner.py` and
  `speculative/eagle_worker.py`; the target turns ids into capture points in
  `models/llama.py::set_eagle3_layers_to_capture` (`val + 1`, changed by PR #25454, see
  `eaglewire.contract.numbering`).
- vLLM: vllm-project/vllm `vllm/model_executor/models/llama_eagle3.py` @ 00bd1493b3e8
  (`Eagle3LlamaForCausalLM.load_weights`, `LlamaModel.load_weights`): tensors `fc.weight`,
  `layers.0.*` (`midlayer.*` renamed to it), `norm.weight`, `lm_head.weight`, `embed_tokens.weight`
  (optional: shared from the target when absent), `d2t` (-> draft_id_to_target_id, offsets) and
  `t2d` (skipped); names must not carry a `model.` prefix (the loader adds it). `fc` is
  `target_hidden_size * 3` wide. `norm_before_residual` is read from the config.
  Speculators configs are translated in `vllm/transformers_utils/configs/speculators/base.py`
  @ 052316aeab2a (`speculators_model_type`, `transformer_layer_config`,
  `speculators_config.proposal_methods[0].speculative_tokens`, `speculators_config.verifier.name_or_path`)
  and `.../speculators/algos.py` (`update_eagle3`: `draft_vocab_size`, `target_hidden_size`,
  `norm_before_residual` defaulting to True when absent, top-level
  `eagle_aux_hidden_state_layer_ids`); target capture in `vllm/model_executor/models/llama.py`
  (`if idx in aux_hidden_state_layers` before layer idx runs: id = boundary).
- speculators: vllm-project/speculators `src/speculators/models/eagle3/config.py` and `core.py`
  @ c05b95b303f7 (= PyPI speculators 0.9.0): `Eagle3SpeculatorConfig` (pydantic) and
  `Eagle3DraftModel` tensors `embed_tokens.weight`, `fc.weight`, `layers.0.*`, `norm.weight`,
  `lm_head.weight`, `d2t`/`t2d` only when draft_vocab_size != vocab_size;
  `transformer_layer_config.model_type` picks the layer class (Qwen3 when absent).
- EAGLE official: SafeAILab/EAGLE `eagle/model/cnets.py` @ cb7e0841fe0c (`Model`): a plain
  `LlamaForCausalLM` config with `num_hidden_layers: 1`, `draft_vocab_size`, optional
  `target_hidden_size`; tensors `midlayer.*`, `fc.weight`, `norm.weight`, `lm_head.weight`,
  `embed_tokens.weight` (else loaded from the target), `d2t`, `t2d`; aux states hard-coded in
  `eagle/model/modeling_llama_kv.py` (`idx in {2, L//2, L-3}` before layer idx).
"""

from __future__ import annotations

from typing import Literal

EngineFormat = Literal["sglang", "vllm", "eagle"]
FORMATS: tuple[EngineFormat, ...] = ("sglang", "vllm", "eagle")

# Both engines build fc as `target_hidden_size * 3` (a literal in their code), so a draft with
# another number of aux states cannot be served by them.
ENGINE_NUM_AUX = 3

# --- tensors -------------------------------------------------------------------------------
EAGLEWIRE_LAYER_PREFIX = "layer."
EAGLEWIRE_VOCAB_BUFFER = "draft_to_target"
LAYER_PREFIX: dict[EngineFormat, str] = {"sglang": "midlayer.", "vllm": "layers.0.", "eagle": "midlayer."}
# Names inside the single decoder layer (identical in eaglewire and every engine).
LAYER_TENSORS = (
    "input_layernorm.weight",
    "hidden_norm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
EMBED = "embed_tokens.weight"
TOP_TENSORS = ("fc.weight", "norm.weight", "lm_head.weight")
D2T = "d2t"
T2D = "t2d"
VOCAB_TENSORS = (D2T, T2D)


def layer_names(fmt: EngineFormat) -> tuple[str, ...]:
    return tuple(LAYER_PREFIX[fmt] + n for n in LAYER_TENSORS)


def required_tensors(fmt: EngineFormat) -> frozenset[str]:
    """Tensors the engine cannot run without (it takes embed_tokens from the target, d2t defaults to identity)."""
    return frozenset(TOP_TENSORS + layer_names(fmt))


def loader_tensors(fmt: EngineFormat) -> frozenset[str]:
    """Every tensor name the engine's loader maps to a parameter or buffer."""
    return required_tensors(fmt) | {EMBED, *VOCAB_TENSORS}


# Written by other tools, never read by an engine's inference path: ignored on import.
IGNORED_ON_IMPORT = frozenset({"verifier_lm_head.weight", "verifier_norm.weight"})
# A prefix SGLang's loader strips (`f"model.{name}"` lookup); vLLM's loader would double it.
SGLANG_OPTIONAL_PREFIX = "model."

# --- config.json ---------------------------------------------------------------------------
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
SPECULATORS_MODEL_TYPE = "eagle3"
EAGLE_ARCHITECTURE = "LlamaForCausalLM"
LLAMA_MODEL_TYPE = "llama"
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
SGLANG_NESTED = "eagle_config"
USE_AUX_KEY = "use_aux_hidden_state"

# A single Llama decoder layer, as SGLang's/vLLM's LlamaConfig-based classes read it.
LLAMA_LAYER_KEYS = frozenset(
    {
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_hidden_layers",
        "vocab_size",
        "rms_norm_eps",
        "max_position_embeddings",
        "rope_theta",
        "hidden_act",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
    }
)
SGLANG_CONFIG_KEYS = LLAMA_LAYER_KEYS | {
    "architectures",
    "draft_vocab_size",
    "target_hidden_size",
    SGLANG_NESTED,
}
SGLANG_EAGLE_CONFIG_KEYS = frozenset({IDS_KEY, USE_AUX_KEY})

SPECULATORS_CONFIG_KEYS = frozenset(
    {
        "speculators_model_type",
        "architectures",
        "transformer_layer_config",
        "draft_vocab_size",
        "norm_before_residual",
        "target_hidden_size",
        IDS_KEY,
        "speculators_config",
    }
)
SPECULATORS_SPEC_KEYS = frozenset({"algorithm", "proposal_methods", "default_proposal_method", "verifier"})
SPECULATORS_VERIFIER_KEYS = frozenset({"name_or_path", "architectures"})
SPECULATORS_PROPOSAL_TYPE = "greedy"
