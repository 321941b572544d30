"""Tiny randomly initialised targets (and a tiny BPE tokenizer with a chat template), built offline.

Every architecture eaglewire supports gets a config small enough that a forward pass costs
milliseconds on CPU. Nothing here downloads anything.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from eaglewire.target.loading import LoadedTarget

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Hello! How are you today? I am fine, thank you.",
    "Speculative decoding drafts tokens and the target verifies them in one forward pass.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10: numbers and more numbers.",
    "What is your favourite book? I like reading about history and science.",
    "import torch\nx = torch.zeros(3)\nprint(x)\n",
]
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "deepseek_v3")
# Every architecture eaglewire captures from (MoE variants are slower to build, so only capture tests use them all).
CAPTURE_ARCHITECTURES = (*ARCHITECTURES, "qwen3_moe")


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config(arch: str, vocab_size: int, num_layers: int = 8) -> Any:
    import transformers as tf

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "llama":
        return tf.LlamaConfig(**common, architectures=["LlamaForCausalLM"])
    if arch == "mistral":
        return tf.MistralConfig(**common, architectures=["MistralForCausalLM"], sliding_window=None)
    if arch == "qwen2":
        return tf.Qwen2Config(**common, architectures=["Qwen2ForCausalLM"])
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16, architectures=["Qwen3ForCausalLM"])
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **common,
            head_dim=16,
            architectures=["Qwen3MoeForCausalLM"],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
        )
    if arch == "deepseek_v3":
        return tf.DeepseekV3Config(
            **common,
            architectures=["DeepseekV3ForCausalLM"],
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        )
    raise ValueError(arch)


def make_tiny_target(
    arch: str = "llama", *, num_layers: int = 8, seed: int = 0, dtype: torch.dtype = torch.float32
) -> LoadedTarget:
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    cfg = tiny_config(arch, vocab_size=len(tok), num_layers=num_layers)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval().requires_grad_(False)
    return LoadedTarget(model=model, tokenizer=tok, path=Path(f"<tiny-{arch}>"))


def make_peaked_target(num_layers: int = 8, seed: int = 0) -> LoadedTarget:
    """A tiny Llama target whose lm_head is scaled up so its next-token distribution is peaked
    (a random init is nearly uniform, which leaves a draft nothing to learn)."""
    target = make_tiny_target("llama", num_layers=num_layers, seed=seed)
    with torch.no_grad():
        target.model.lm_head.weight.mul_(40.0)
    return target


def save_tiny_target(target: LoadedTarget, directory: Path) -> Path:
    target.model.save_pretrained(directory, safe_serialization=True)
    target.tokenizer.save_pretrained(directory)
    return directory
