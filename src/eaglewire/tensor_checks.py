"""Checks of loaded weights' values: non-finite numbers, and the draft's vocabulary map.

A NaN in `fc.weight` passes every shape check and then turns every draft logit into NaN: decoding
picks garbage ids, evaluation prints NaN tables. An out-of-range or repeated id in `draft_to_target`
makes a draft token a token the target does not have, or two draft tokens one target token. Both are
refused where weights are loaded, naming the tensor and the first bad entry.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from eaglewire.errors import CheckpointError, EaglewireError

# Elements per isfinite pass: bounds the temporary bool mask for large embeddings (~16 MB).
FINITE_CHUNK = 1 << 24


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(flat % d)
        flat //= d
    return out[::-1]


def nonfinite(t: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(count, NaNs, infs, first flat index) of the non-finite values of `t`; None when all are finite
    (or `t` is not floating point)."""
    if not (t.is_floating_point() or t.is_complex()):
        return None
    flat = t.detach().reshape(-1)
    count = nans = 0
    first = -1
    for s in range(0, flat.numel(), FINITE_CHUNK):
        part = flat[s : s + FINITE_CHUNK]
        bad = ~torch.isfinite(part)
        if bool(bad.any()):
            count += int(bad.sum())
            nans += int(torch.isnan(part).sum())
            if first < 0:
                first = s + int(bad.nonzero()[0, 0])
    return None if count == 0 else (count, nans, count - nans, first)


def check_finite(
    tensors: Mapping[str, torch.Tensor],
    *,
    where: str,
    error: type[EaglewireError] = CheckpointError,
    fix: str,
) -> None:
    """Raise `error` naming every tensor of `tensors` that holds NaN or inf: how many values, and the
    first one's index and value."""
    problems = []
    for name, t in tensors.items():
        found = nonfinite(t)
        if found is None:
            continue
        count, nans, infs, first = found
        idx = _index(first, tuple(t.shape))
        value = t.detach().reshape(-1)[first].item()
        problems.append(
            f"tensor {name!r} {tuple(t.shape)}: {count} of {t.numel()} values are not finite ({nans} NaN, "
            f"{infs} inf); the first is [{', '.join(map(str, idx))}] = {value}"
        )
    if problems:
        raise error(f"{where}: non-finite weights:\n  " + "\n  ".join(problems), fix=fix)


def check_vocab_map(
    draft_to_target: torch.Tensor,
    vocab_size: int | None,
    *,
    where: str,
    error: type[EaglewireError] = CheckpointError,
    fix: str | None = None,
) -> None:
    """`draft_to_target` [Vd] (absolute target ids) must be 1-D integers in [0, V), each id once
    (`vocab_size` None: V unknown, only negative ids are out of range). The message names the first
    bad entry (and, for a repeat, the entry it repeats)."""
    d2t = draft_to_target.detach().cpu()
    if d2t.dim() != 1:
        raise error(
            f"{where}: draft_to_target: expected a 1-D [Vd] tensor, got shape {tuple(d2t.shape)}", fix=fix
        )
    if d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
        raise error(f"{where}: draft_to_target: expected integer target ids, got dtype {d2t.dtype}", fix=fix)
    d2t = d2t.long()
    bad = d2t < 0 if vocab_size is None else (d2t < 0) | (d2t >= vocab_size)
    outside = bad.nonzero().flatten()
    if outside.numel():
        i = int(outside[0])
        allowed = (
            "be non-negative"
            if vocab_size is None
            else f"be in 0..{vocab_size - 1} (V = {vocab_size}, the target's vocabulary)"
        )
        raise error(
            f"{where}: draft_to_target[{i}] = {int(d2t[i])}: target ids must {allowed}; "
            f"{outside.numel()} of {d2t.numel()} entries are outside",
            fix=fix,
        )
    values, order = torch.sort(d2t, stable=True)
    repeats = (values[1:] == values[:-1]).nonzero().flatten()
    if repeats.numel():
        # the first entry (in draft order) that repeats an earlier one, and that earlier one
        later = order[repeats + 1]
        k = int(torch.argmin(later))
        j = int(later[k])
        i = int((d2t == d2t[j]).nonzero()[0, 0])
        raise error(
            f"{where}: draft_to_target[{j}] = {int(d2t[j])} repeats draft_to_target[{i}]: a duplicated target id "
            f"(two draft tokens would be one target token; each id may appear once); {repeats.numel()} of "
            f"{d2t.numel()} entries repeat an earlier one",
            fix=fix,
        )
