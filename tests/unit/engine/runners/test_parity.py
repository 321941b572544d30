"""FastTargetRunner against transformers in float32: logits and aux states, prefill and decode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglewire.contract.contract import FinalState
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.errors import BoundaryError, ConfigError, UnsupportedArchitectureError
from eaglewire.target.capture import capture
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import make_tiny_target
from tests.unit.engine.runners.tiny_targets import tiny

ATOL = 1e-4


def _positions(B: int, T: int, start: int = 0) -> torch.Tensor:
    return (start + torch.arange(T))[None].expand(B, T)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_prefill_logits_and_aux_match_transformers(arch: str) -> None:
    target = tiny(arch)
    L = target.num_layers
    bounds = (0, 1, L // 2, L)  # embedding output, a layer input, the middle, the pre-norm final state
    ids = torch.randint(0, target.vocab_size, (2, 19), generator=torch.Generator().manual_seed(0))
    ref = capture(target.model, ids, aux_boundaries=bounds, final=FinalState(L, "pre"), return_logits=True)
    runner = FastTargetRunner(target, bounds, max_batch_size=2, max_seq_len=64)
    runner.reset(2)
    out = runner.forward(ids, _positions(2, 19))
    assert out.logits.dtype == torch.float32 and out.logits.shape == (2, 19, target.vocab_size)
    assert out.aux.shape == (2, 19, len(bounds) * target.hidden_size)
    torch.testing.assert_close(out.logits, ref.logits.float(), atol=ATOL, rtol=0)
    torch.testing.assert_close(out.aux, ref.aux, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prefill_then_token_by_token_equals_one_forward(arch: str) -> None:
    target = tiny(arch)
    L = target.num_layers
    ids = torch.randint(0, target.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    full = FastTargetRunner(target, (2, L), max_batch_size=2, max_seq_len=64)
    full.reset(2)
    whole = full.forward(ids, _positions(2, 16))
    step = FastTargetRunner(target, (2, L), max_batch_size=2, max_seq_len=64)
    step.reset(2)
    parts = [step.forward(ids[:, :5], _positions(2, 5))]
    step.commit_prefix(torch.tensor([5, 5]))
    for t in range(5, 16):
        parts.append(step.forward(ids[:, t : t + 1], step.lengths[:, None]))
        step.commit(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, dtype=torch.long))
    assert step.lengths.tolist() == [16, 16]
    torch.testing.assert_close(torch.cat([p.logits for p in parts], 1), whole.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat([p.aux for p in parts], 1), whole.aux, atol=ATOL, rtol=0)


def test_llama3_rope_biases_and_far_positions_match_transformers() -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=200,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    for p in model.parameters():  # HF initialises biases to zero: make them matter
        p.add_(torch.randn_like(p) * 0.02)
    target = LoadedTarget(model=model, tokenizer=None, path=Path("<llama3>"))
    ids = torch.randint(0, 200, (1, 12))
    pos = _positions(1, 12, start=20000)  # past the original context: llama3 scaling is in play
    ref = model(ids, position_ids=pos).logits
    runner = FastTargetRunner(target, (1,), max_batch_size=1, max_seq_len=16)
    out = runner.forward(ids, pos)
    torch.testing.assert_close(out.logits, ref, atol=ATOL, rtol=0)


def test_input_errors_name_the_tensor() -> None:
    target = tiny("llama")
    with pytest.raises(BoundaryError, match="aux_boundaries"):
        FastTargetRunner(target, (target.num_layers + 1,), max_batch_size=1, max_seq_len=8)
    runner = FastTargetRunner(target, (1,), max_batch_size=2, max_seq_len=8)
    runner.reset(2)
    with pytest.raises(ConfigError, match="input_ids"):
        runner.forward(torch.zeros(1, 3, dtype=torch.long), _positions(1, 3))
    with pytest.raises(ConfigError, match="tree_mask"):
        runner.forward(
            torch.zeros(2, 3, dtype=torch.long), _positions(2, 3), torch.ones(2, 3, 2, dtype=torch.bool)
        )
    runner.forward(torch.zeros(2, 6, dtype=torch.long), _positions(2, 6))
    runner.commit_prefix(torch.tensor([6, 6]))
    with pytest.raises(ConfigError, match="KV cache full"):
        runner.forward(torch.zeros(2, 60, dtype=torch.long), _positions(2, 60, 6))
    with pytest.raises(ConfigError, match="max_batch_size"):
        runner.reset(3)


def test_non_llama_architecture_is_refused_by_the_fast_runner() -> None:
    with pytest.raises(UnsupportedArchitectureError, match="recompute runner"):
        FastTargetRunner(tiny("deepseek_v3", 2), (1,), max_batch_size=1, max_seq_len=8)


def test_the_runtime_holds_no_copy_of_the_models_weights() -> None:
    """The stacked q/k/v and gate/up are the model's own storage (its weights become views of their
    rows): the runtime adds no weight bytes, and the model computes exactly what it did. A runtime
    in another dtype keeps a copy and leaves the model alone."""
    from eaglewire.engine.runners.fast.weights import LAYER_FIELDS

    target = make_tiny_target("llama", num_layers=3)  # its own: the runner changes storage layout
    model, L = target.model, target.num_layers
    ids = torch.randint(0, target.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    final = FinalState(L, "pre")
    before = capture(model, ids, aux_boundaries=(1, L), final=final, return_logits=True)
    params = dict(model.named_parameters())
    other = FastTargetRunner(target, (1, L), max_batch_size=1, max_seq_len=32, dtype=torch.float64)
    assert all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in model.parameters())
    runner = FastTargetRunner(target, (1, L), max_batch_size=1, max_seq_len=32)
    assert dict(model.named_parameters()) == params  # the same parameter objects
    w = runner.weights
    tensors = [w.embed, w.lm_head, w.final_norm, *(t for layer in w.layers for t in layer if t is not None)]
    model_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert {t.untyped_storage().data_ptr() for t in tensors} <= model_storages
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    qkv, gate_up = (w.layers[0][LAYER_FIELDS.index(name)] for name in ("qkv", "gate_up"))
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == qkv[w.spec.q_width + w.spec.kv_width :].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == gate_up[w.spec.intermediate_size :].data_ptr()
    after = capture(model, ids, aux_boundaries=(1, L), final=final, return_logits=True)
    torch.testing.assert_close(after.logits, before.logits, atol=0, rtol=0)
    for r in (runner, other):
        r.reset(1)
        torch.testing.assert_close(
            r.forward(ids, _positions(1, 9)).logits, before.logits.float(), atol=ATOL, rtol=0
        )
