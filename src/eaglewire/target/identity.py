"""Build a target's contract (identity hashes + fingerprint) and check a contract against a live target."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from eaglewire.contract.contract import Contract, FinalState, TargetIdentity
from eaglewire.contract.fingerprint import (
    PROBE_TEXT,
    Fingerprint,
    FingerprintMatch,
    NormSide,
    StateKey,
    fingerprint_tensor,
    match_fingerprint,
)
from eaglewire.contract.numbering import default_boundaries, validate_boundaries
from eaglewire.errors import FingerprintMismatchError
from eaglewire.io_utils import sha256_json, sha256_text
from eaglewire.target.capture import capture_all
from eaglewire.target.loading import LoadedTarget, dtype_name

# Config keys that change with how a model was saved or loaded, not with what it computes.
VOLATILE_CONFIG_KEYS = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "quantization_config",
        "use_cache",
        "_commit_hash",
    }
)
PROBE_FALLBACK_IDS = (1, 504, 2914, 6354, 21, 3041, 665, 260, 23564, 3614, 30, 216, 33, 28, 216, 34)


def config_hash(config: Any) -> str:
    d = {k: v for k, v in config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS}
    return sha256_json(d)


def tokenizer_hash(tokenizer: Any) -> str:
    if tokenizer is None:
        return "none"
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    specials = {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}
    return sha256_json({"vocab": vocab, "special": specials})


def chat_template_hash(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    return sha256_text(template) if isinstance(template, str) else "none"


def target_identity(target: LoadedTarget) -> TargetIdentity:
    return TargetIdentity(
        architecture=target.architecture,
        num_layers=target.num_layers,
        hidden_size=target.hidden_size,
        vocab_size=target.vocab_size,
        config_hash=config_hash(target.config),
        tokenizer_hash=tokenizer_hash(target.tokenizer),
        chat_template_hash=chat_template_hash(target.tokenizer),
        name=str(target.path),
    )


def probe_ids(target: LoadedTarget) -> list[int]:
    """Token ids of PROBE_TEXT; a fixed id list (clipped to the vocab) when there is no tokenizer."""
    if target.tokenizer is not None:
        return list(target.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    return [i % target.vocab_size for i in PROBE_FALLBACK_IDS]


def states_on_probe(target: LoadedTarget, ids: Sequence[int]) -> dict[StateKey, torch.Tensor]:
    """Every boundary on the probe: key -> [T, Ht]."""
    x = torch.tensor([list(ids)], device=target.device)
    return {k: v[0] for k, v in capture_all(target.model, x).items()}


def compute_fingerprint(
    target: LoadedTarget, aux_boundaries: Sequence[int], final: FinalState
) -> Fingerprint:
    ids = probe_ids(target)
    states = states_on_probe(target, ids)
    entries = [
        fingerprint_tensor(f"aux[{i}]", StateKey(b), states[StateKey(b)])
        for i, b in enumerate(aux_boundaries)
    ]
    final_key = StateKey(final.boundary, final.norm)
    entries.append(fingerprint_tensor("final", final_key, states[final_key]))
    return Fingerprint(probe_ids=tuple(ids), dtype=dtype_name(target.dtype), tensors=tuple(entries))


def build_contract(
    target: LoadedTarget,
    aux_boundaries: Sequence[int] | None = None,
    *,
    final_norm: NormSide | None = None,
    final: FinalState | None = None,
    fingerprint: bool = True,
    what: str = "aux boundaries",
) -> Contract:
    """The contract for capturing `aux_boundaries` (default `[2, L//2, L-3]`) from `target`, with its
    identity, dtype and a fingerprint taken on it. The final state is boundary L on the `final_norm`
    side (default pre-norm), or `final` as given (a relabel keeps its data's); not both. `what` names
    the boundaries in a refusal (a flag, as typed)."""
    if final is not None and final_norm is not None:
        raise ValueError(f"build_contract: final={final} and final_norm={final_norm!r} both given; pass one")
    L = target.num_layers
    aux = (
        validate_boundaries(aux_boundaries, L, what=what)
        if aux_boundaries is not None
        else default_boundaries(L)
    )
    final = final if final is not None else FinalState(boundary=L, norm=final_norm or "pre")
    return Contract(
        target=target_identity(target),
        aux_boundaries=aux,
        final=final,
        dtype=dtype_name(target.dtype),
        fingerprint=compute_fingerprint(target, aux, final) if fingerprint else None,
    )


def check_fingerprint(
    contract: Contract, target: LoadedTarget, *, raise_on_mismatch: bool = True
) -> list[FingerprintMatch]:
    """Recompute every boundary on the contract's probe; say which boundary each stored tensor is."""
    if contract.fingerprint is None:
        raise FingerprintMismatchError(
            "contract has no fingerprint to check", fix="rebuild it with fingerprint=True"
        )
    states = states_on_probe(target, contract.fingerprint.probe_ids)
    matches = match_fingerprint(contract.fingerprint, states, live_dtype=dtype_name(target.dtype))
    bad = [m for m in matches if not m.ok]
    if bad and raise_on_mismatch:
        raise FingerprintMismatchError(
            "hidden states do not match the contract's fingerprint:\n  "
            + "\n  ".join(m.explain() for m in bad),
            fix="capture the boundaries the contract declares (see `eaglewire ids`), or rebuild the data/draft",
        )
    return matches
