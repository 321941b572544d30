"""Create an untrained draft for a target: shapes from the target, embeddings copied from it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from eaglewire.contract.contract import Contract
from eaglewire.draft.config import DraftConfig, draft_config_for_target
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import ConfigError
from eaglewire.target.architectures import target_parts
from eaglewire.target.loading import LoadedTarget
from eaglewire.tensor_checks import check_vocab_map

log = logging.getLogger(__name__)


def init_draft(
    target: LoadedTarget,
    contract: Contract,
    *,
    draft_to_target: Sequence[int] | torch.Tensor | None = None,
    config: DraftConfig | None = None,
    intermediate_size: int | None = None,
    num_attention_heads: int | None = None,
    seed: int = 0,
) -> Eagle3Draft:
    """A fresh draft: target embeddings (frozen by training by default) and lm_head rows copied from
    the target's lm_head for the draft vocabulary, the rest randomly initialised with `seed`.
    intermediate_size / num_attention_heads: the draft layer's MLP width and query heads (None: the
    target's), when `config` is None."""
    if config is not None:
        for name, asked in (
            ("intermediate_size", intermediate_size),
            ("num_attention_heads", num_attention_heads),
        ):
            if asked is not None:
                raise ConfigError(
                    f"init_draft: config ({name}={getattr(config, name)}) and {name}={asked} both given; "
                    "set it in the config"
                )
    if draft_to_target is not None:
        d2t = torch.as_tensor(draft_to_target, dtype=torch.long)
    else:
        d2t = torch.arange(target.vocab_size, dtype=torch.long)
    cfg = config or draft_config_for_target(
        target.config,
        num_aux=contract.num_aux,
        draft_vocab_size=len(d2t),
        intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads,
    )
    if cfg.draft_vocab_size != len(d2t):
        raise ConfigError(f"draft_vocab_size={cfg.draft_vocab_size} but the vocab map has {len(d2t)} entries")
    check_vocab_map(d2t, cfg.vocab_size, where="vocab map", error=ConfigError)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    draft.get_buffer("draft_to_target").copy_(d2t)
    parts = target_parts(target.model)
    with torch.no_grad():
        if cfg.hidden_size == target.hidden_size:
            draft.embed_tokens.weight.copy_(parts.embed_tokens.weight.float())
            draft.lm_head.weight.copy_(parts.lm_head.get_parameter("weight").float()[d2t])
        else:
            log.warning(
                "draft hidden %d != target hidden %d: embeddings start random",
                cfg.hidden_size,
                target.hidden_size,
            )
    return draft
