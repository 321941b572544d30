"""Vocabulary map in the engines' form: offset `d2t` and boolean `t2d`, both directions, validated.

Inside eaglewire a draft holds absolute ids: `draft_to_target[d]` is the target id of draft id
`d` ([Vd] int64). SGLang, vLLM, speculators and EAGLE's own code store instead

    d2t [Vd] int64   offsets: target = d + d2t[d]
    t2d [V]  bool    t2d[t] is True for the Vd target ids the draft can emit

(SGLang `LlamaForCausalLMEagle3.load_weights`: `hot_token_id = d2t + arange(Vd)`; vLLM
`Eagle3LlamaForCausalLM.compute_logits`: `targets = arange(Vd) + draft_id_to_target_id`.)

The classic failure is a lost map: an all-zero `d2t` while Vd < V silently turns draft token
d into target token d. Reading refuses it unless `t2d` says exactly that.
"""

from __future__ import annotations

import torch

from eaglewire.errors import CheckpointError


def validate_draft_to_target(
    draft_to_target: torch.Tensor, vocab_size: int, *, where: str = "draft_to_target"
) -> None:
    """Absolute ids [Vd]: integers in 0..V-1, no target id twice, Vd <= V."""
    if draft_to_target.dim() != 1:
        raise CheckpointError(
            f"{where}: expected a 1-D [Vd] tensor, got shape {tuple(draft_to_target.shape)}"
        )
    if draft_to_target.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
        raise CheckpointError(f"{where}: expected integer ids, got dtype {draft_to_target.dtype}")
    vd = int(draft_to_target.numel())
    if vd == 0 or vd > vocab_size:
        raise CheckpointError(f"{where}: expected 1..{vocab_size} entries (Vd <= V = {vocab_size}), got {vd}")
    lo, hi = int(draft_to_target.min()), int(draft_to_target.max())
    if lo < 0 or hi >= vocab_size:
        bad = torch.nonzero((draft_to_target < 0) | (draft_to_target >= vocab_size)).flatten()[:5].tolist()
        raise CheckpointError(
            f"{where}: target ids must be in 0..{vocab_size - 1} (V = {vocab_size}); got {lo}..{hi} "
            f"(first bad draft ids: {bad})"
        )
    if len(torch.unique(draft_to_target)) != vd:
        raise CheckpointError(
            f"{where}: {vd - len(torch.unique(draft_to_target))} target ids appear twice; the map must be one-to-one"
        )


def absolute_to_offsets(draft_to_target: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_to_target [Vd] absolute -> (d2t [Vd] int64 offsets, t2d [V] bool with Vd True entries)."""
    draft_to_target = draft_to_target.detach().cpu().long()
    validate_draft_to_target(draft_to_target, vocab_size)
    d2t = draft_to_target - torch.arange(draft_to_target.numel(), dtype=torch.long)  # [Vd]
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_to_target] = True
    return d2t, t2d


def is_identity(draft_to_target: torch.Tensor, vocab_size: int) -> bool:
    """True when the draft predicts the full target vocabulary in target order (no map needed)."""
    return int(draft_to_target.numel()) == vocab_size and bool(
        torch.equal(draft_to_target.cpu().long(), torch.arange(vocab_size, dtype=torch.long))
    )


def offsets_to_absolute(
    d2t: torch.Tensor | None,
    t2d: torch.Tensor | None,
    *,
    vocab_size: int,
    draft_vocab_size: int,
    where: str = "checkpoint",
) -> torch.Tensor:
    """(d2t [Vd] offsets or None, t2d [V] bool or None) -> draft_to_target [Vd] absolute ids.

    No d2t means the engines' identity (draft id = target id), valid only when Vd == V.
    Every inconsistency is an error naming the tensor, expected and actual.
    """
    if d2t is None:
        if draft_vocab_size != vocab_size:
            raise CheckpointError(
                f"{where}: tensor 'd2t' missing while draft_vocab_size={draft_vocab_size} < vocab_size={vocab_size}: "
                "engines would read draft token d as target token d",
                fix="export the draft with its vocabulary map (d2t offsets, target = draft + d2t[draft])",
            )
        absolute = torch.arange(vocab_size, dtype=torch.long)
    else:
        if d2t.dim() != 1 or int(d2t.numel()) != draft_vocab_size:
            raise CheckpointError(
                f"{where}: tensor 'd2t': expected shape ({draft_vocab_size},) (draft_vocab_size), got {tuple(d2t.shape)}"
            )
        if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
            raise CheckpointError(f"{where}: tensor 'd2t': expected an integer dtype, got {d2t.dtype}")
        d2t = d2t.long()
        if draft_vocab_size < vocab_size and bool((d2t == 0).all()):
            prefix_t2d = (
                t2d is not None
                and bool(t2d.bool()[:draft_vocab_size].all())
                and int(t2d.bool().sum()) == draft_vocab_size
            )
            if not prefix_t2d:
                raise CheckpointError(
                    f"{where}: tensor 'd2t' is all zeros while draft_vocab_size={draft_vocab_size} < "
                    f"vocab_size={vocab_size}: draft token d would become target token d (the map looks lost; "
                    "t2d does not confirm it)",
                    fix="re-export the draft with its real vocabulary map",
                )
        absolute = torch.arange(draft_vocab_size, dtype=torch.long) + d2t  # [Vd]
        try:
            validate_draft_to_target(absolute, vocab_size, where=f"{where}: arange(Vd) + d2t")
        except CheckpointError as e:
            raise CheckpointError(f"{e} (d2t holds offsets: target = draft + d2t[draft])") from None
    if t2d is not None:
        _check_t2d(t2d, absolute, vocab_size=vocab_size, where=where)
    return absolute


def _check_t2d(t2d: torch.Tensor, absolute: torch.Tensor, *, vocab_size: int, where: str) -> None:
    if t2d.dim() != 1 or int(t2d.numel()) != vocab_size:
        raise CheckpointError(
            f"{where}: tensor 't2d': expected shape ({vocab_size},) (vocab_size), got {tuple(t2d.shape)}"
        )
    mask = t2d.bool()
    count = int(mask.sum())
    if count != int(absolute.numel()):
        raise CheckpointError(
            f"{where}: tensor 't2d' marks {count} target ids, expected {int(absolute.numel())} (draft_vocab_size)"
        )
    missing = absolute[~mask[absolute]]
    if missing.numel():
        raise CheckpointError(
            f"{where}: tensors 'd2t' and 't2d' disagree: {int(missing.numel())} target ids reachable through d2t are "
            f"False in t2d (first: {missing[:5].tolist()})"
        )
