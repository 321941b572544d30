"""The EAGLE-3 draft's architecture config (saved as config.json beside the weights)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json
from eaglewire.typed_config import from_dict, help_field, read_json_file, to_dict

DRAFT_CONFIG_FILE = "config.json"
DRAFT_FORMAT = "eaglewire-eagle3"


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int = help_field("draft hidden size H")
    intermediate_size: int = help_field("MLP inner size of the draft decoder layer")
    num_attention_heads: int = help_field("attention heads of the draft layer")
    num_key_value_heads: int = help_field("key/value heads (GQA); divides num_attention_heads")
    head_dim: int = help_field("size of one attention head")
    vocab_size: int = help_field("target vocabulary V (the embedding table's rows)")
    draft_vocab_size: int = help_field("draft vocabulary Vd (lm_head rows); <= vocab_size")
    target_hidden_size: int = help_field("target hidden size Ht (each aux state's width)")
    num_aux: int = help_field("number of aux states A concatenated into fc (A*Ht wide)")
    rms_norm_eps: float = help_field("epsilon of every RMSNorm")
    rope_parameters: dict[str, Any] = help_field(
        "Hugging Face rope_parameters (rope_type, rope_theta, scaling keys)"
    )
    max_position_embeddings: int = help_field("longest position the draft's RoPE is configured for")
    hidden_act: Literal["silu"] = help_field("MLP activation", default="silu")
    format: str = help_field("marks the file as an eaglewire draft config", default=DRAFT_FORMAT)
    extra: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "free-form notes (not read by code)"}
    )

    def __post_init__(self) -> None:
        if self.format != DRAFT_FORMAT:
            raise ConfigError(
                f"format: expected {DRAFT_FORMAT!r}, got {self.format!r} (an engine export? use `eaglewire import`)"
            )
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "draft_vocab_size",
            "target_hidden_size",
            "num_aux",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(
                f"draft_vocab_size={self.draft_vocab_size} exceeds vocab_size={self.vocab_size} (the target's)"
            )
        if "rope_theta" not in self.rope_parameters:
            raise ConfigError(
                f"rope_parameters: missing 'rope_theta' (got keys {sorted(self.rope_parameters)})"
            )

    @property
    def aux_width(self) -> int:
        return self.num_aux * self.target_hidden_size

    def save(self, directory: Path) -> None:
        atomic_write_json(Path(directory) / DRAFT_CONFIG_FILE, to_dict(self))

    @classmethod
    def load(cls, directory: Path) -> DraftConfig:
        path = Path(directory) / DRAFT_CONFIG_FILE
        return from_dict(cls, read_json_file(path), where=str(path))


def draft_config_for_target(
    target_config: Any,
    *,
    num_aux: int,
    draft_vocab_size: int | None = None,
    intermediate_size: int | None = None,
    num_attention_heads: int | None = None,
) -> DraftConfig:
    """A draft shaped like one decoder layer of the target (EAGLE-3's default). `intermediate_size`
    widens (or narrows) its MLP; `num_attention_heads` changes its query heads, with the key/value
    heads scaled to keep the target's grouping and each head the target's size. SGLang and vLLM build
    the draft layer from the draft's own config, so both travel with an export."""
    if intermediate_size is not None and intermediate_size < 1:
        raise ConfigError(f"draft intermediate_size: expected >= 1, got {intermediate_size}")
    H = int(target_config.hidden_size)
    target_heads = int(target_config.num_attention_heads)
    target_kv_heads = int(getattr(target_config, "num_key_value_heads", None) or target_heads)
    group = max(1, target_heads // target_kv_heads)  # query heads per key/value head
    heads = target_heads if num_attention_heads is None else num_attention_heads
    if heads < 1 or heads % group:
        raise ConfigError(
            f"draft num_attention_heads: expected a positive multiple of {group} (the target's "
            f"num_attention_heads={target_heads} / num_key_value_heads={target_kv_heads}), got {heads}"
        )
    rope = dict(
        getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    )
    return DraftConfig(
        hidden_size=H,
        intermediate_size=int(intermediate_size or target_config.intermediate_size),
        num_attention_heads=heads,
        num_key_value_heads=heads // group,
        # MLA targets (DeepSeek) have no Llama-style head_dim; the draft layer is plain Llama attention.
        head_dim=H // target_heads
        if hasattr(target_config, "kv_lora_rank")
        else int(getattr(target_config, "head_dim", None) or H // target_heads),
        vocab_size=int(target_config.vocab_size),
        draft_vocab_size=int(draft_vocab_size or target_config.vocab_size),
        target_hidden_size=H,
        num_aux=num_aux,
        rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-6)),
        rope_parameters=rope,
        max_position_embeddings=int(getattr(target_config, "max_position_embeddings", 4096)),
    )
