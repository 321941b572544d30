"""The exact tensor names and config keys each engine's EAGLE-3 loader reads (foreign names live here).

Read from the engines' released packages (read, not copied; `scripts/test_external.sh` runs their code
on our exports where it imports on a CPU machine). Re-check when a version changes:

- SGLang, checked against sglang 0.5.12 and 0.5.23 (PyPI wheels): `srt/models/llama_eagle3.py`
  (`LlamaForCausalLMEagle3.__init__` / `load_weights`, 0.5.23 lines 272-378): tensors `fc.weight`,
  `midlayer.*` (renamed to `layers.0.*`: q/k/v_proj stacked into qkv_proj, gate/up_proj into
  gate_up_proj, o_proj, down_proj, input_layernorm, hidden_norm, post_attention_layernorm),
  `norm.weight`, `lm_head.weight`, `embed_tokens.weight`, a `model.` prefix optional; `d2t`
  (hot_token_id = d2t + arange) and `t2d` (skipped). Names it does not know are dropped silently.
  `fc` is `target_hidden_size * num_aux` wide, num_aux = `num_aux_hidden_states`, else the number of
  `eagle_config.eagle_aux_hidden_state_layer_ids`, else 3 (lines 151-167; 0.5.10-0.5.11 built it 3 wide
  whatever the ids). Config:
  `draft_vocab_size` (None = load lm_head from the target), `tie_word_embeddings`,
  `target_hidden_size`, `bias` (fc), `norm_before_fc` / `fc_norm` / `norm_output` (variants eaglewire
  does not train; absent = off); the draft's embedding is replaced by the target's whenever
  `target_hidden_size == hidden_size`. A second draft layer adds the whole residual stream through
  `hidden_norm` (lines 103-105). `eagle_config.eagle_aux_hidden_state_layer_ids` and
  `use_aux_hidden_state` are read in `model_executor/model_runner_components/spec_aux_hidden_state.py`
  (0.5.23 lines 183-196); the target turns ids into capture points in its model file's
  `set_eagle3_layers_to_capture`, per release and architecture: `eaglewire.contract.numbering.ENGINE_RULES`.
- vLLM, checked against vllm 0.33.0: `model_executor/models/llama_eagle3.py`
  (`Eagle3LlamaForCausalLM.load_weights`, lines 418-470): tensors `fc.weight`, `layers.0.*`
  (`midlayer.*` renamed to it), `norm.weight`, `lm_head.weight`, `embed_tokens.weight` (optional:
  shared from the target when absent), `d2t` (-> draft_id_to_target_id, offsets) and `t2d` (skipped);
  names must not carry a `model.` prefix (the loader adds it). `fc` is `target_hidden_size * num_aux`
  wide with num_aux read like SGLang's (lines 209-221) - but from `eagle_config`, which a speculators
  config does not have, so a speculators export gets 3. A second layer adds the residual through
  `input_layernorm` (lines 136-138). Speculators configs are translated in
  `transformers_utils/configs/speculators/base.py` (`speculators_model_type`,
  `transformer_layer_config`, `speculators_config.proposal_methods[0].speculative_tokens`,
  `speculators_config.verifier.name_or_path`) and `.../speculators/algos.py` (`update_eagle3`:
  `draft_vocab_size`, `target_hidden_size`, `norm_before_residual` defaulting to True when absent,
  `norm_before_fc` / `fc_norm` / `norm_output`, top-level `eagle_aux_hidden_state_layer_ids`); the
  verifier is read only when the export directory is served alone, and must then be a hub id
  (`transformers_utils/config.py:859-874`). Target capture: `ENGINE_RULES`.
- speculators, checked against speculators 0.9.0: `models/eagle3/config.py` and `core.py`:
  `Eagle3SpeculatorConfig` (pydantic) and `Eagle3DraftModel` tensors `embed_tokens.weight`,
  `fc.weight`, `layers.0.*`, `norm.weight`, `lm_head.weight`, `d2t`/`t2d` only when
  draft_vocab_size != vocab_size; `transformer_layer_config.model_type` picks the layer class (Qwen3
  when absent). Its `fc` is num_aux * the *draft's* hidden size (core.py:70-78) and
  `load_verifier_weights` refuses a verifier whose hidden size differs (core.py:174-193): it loads our
  exports only when the draft's hidden size is the target's. `from_pretrained` reads the verifier's
  config from `speculators_config.verifier.name_or_path` and checks the ids are distinct and in
  0..L (core.py:165-172, models/utils.py:99-133).
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

# sglang (0.5.12 on) sizes fc by the number of ids it is given; vllm 0.33.0 reads that number from
# `eagle_config`, which a speculators export does not carry, and builds fc for 3: exports keep 3.
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
