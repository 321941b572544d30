"""Name the pattern behind a wiring difference, and the ids that express boundaries in each engine.

Given what a label says (declared boundaries) and what the values are (actual boundaries), say
in one sentence which known fault this is: a shift by k boundaries (an engine's "+1" rule read
the other way), swapped columns, an embedding column that is not there or should not be, labels
one column off (the field reports' "embedding, layer 3, layer 31" that was really layers 2/30/58's
outputs), or states that match no boundary at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from eaglewire.contract.fingerprint import StateKey
from eaglewire.contract.numbering import Numbering, describe_boundary, from_boundaries
from eaglewire.doctor.findings import fmt_list
from eaglewire.errors import BoundaryError

EMBEDDING_BOUNDARY = 0


def key_text(key: StateKey | None, num_layers: int) -> str:
    """'boundary 3 (output of layer 2)' / 'boundary 12 post-norm (after the final norm)' / 'no boundary'."""
    if key is None:
        return "no boundary of this target"
    if key.norm == "post":
        return f"boundary {key.boundary} post-norm (after the final norm)"
    return f"boundary {key.boundary} ({describe_boundary(key.boundary, num_layers)})"


def describe_boundaries(boundaries: Sequence[int], num_layers: int) -> str:
    return ", ".join(f"{b} ({describe_boundary(b, num_layers)})" for b in boundaries)


def _constant_shift(declared: Sequence[int], actual: Sequence[int]) -> int | None:
    deltas = {a - d for d, a in zip(declared, actual, strict=True)}
    if len(deltas) == 1:
        shift = deltas.pop()
        return shift if shift != 0 else None
    return None


def diagnose_aux(
    declared: Sequence[int],
    actual: Sequence[int | None],
    *,
    declared_final: StateKey | None = None,
    actual_final: StateKey | None = None,
) -> str:
    """One sentence naming the fault that turns `declared` aux boundaries into `actual` ones."""
    if any(a is None for a in actual):
        bad = [i for i, a in enumerate(actual) if a is None]
        return (
            f"aux column(s) {bad} match no boundary of this target (another target, another dtype, "
            "states captured on different tokens, or corrupted data)"
        )
    act = [int(a) for a in actual if a is not None]
    dec = list(declared)
    if len(act) != len(dec):
        extra = len(act) - len(dec)
        if extra > 0 and EMBEDDING_BOUNDARY in act and EMBEDDING_BOUNDARY not in dec:
            return (
                f"the data has {extra} more column(s) than its label: an extra embedding column (boundary 0)"
            )
        if extra < 0 and EMBEDDING_BOUNDARY in dec and EMBEDDING_BOUNDARY not in act:
            return f"the data has {-extra} fewer column(s) than its label: the labelled embedding column is missing"
        return f"the data has {len(act)} aux column(s), its label declares {len(dec)}"
    if act == dec:
        return "aux columns match their labels"
    if sorted(act) == sorted(dec):
        return "the same boundaries in a different order (swapped columns)"
    if (
        declared_final is not None
        and actual_final is not None
        and dec
        and dec[0] == EMBEDDING_BOUNDARY
        and act[:-1] == dec[1:]
        and act[-1] == declared_final.boundary
    ):
        return (
            "the labels are one column off: there is no embedding column; the column labelled "
            "'embedding' holds what the next label names, and the last aux column holds what is labelled final "
            "(the field reports' mislabelled dump)"
        )
    shift = _constant_shift(dec, act)
    if shift is not None:
        return (
            f"every column is {abs(shift)} boundar{'y' if abs(shift) == 1 else 'ies'} "
            f"{'deeper' if shift > 0 else 'shallower'} than its label: layer ids read in the wrong numbering "
            "(e.g. 'output of layer i' ids read as boundaries, or the reverse)"
        )
    if EMBEDDING_BOUNDARY in act and EMBEDDING_BOUNDARY not in dec:
        return "an embedding column (boundary 0) is in the data but not in its label"
    if EMBEDDING_BOUNDARY in dec and EMBEDDING_BOUNDARY not in act:
        return "the column labelled 'embedding output' is not the embedding"
    return "aux columns hold other boundaries than their labels say"


def engine_ids_hint(boundaries: Sequence[int], num_layers: int) -> str:
    """'SGLang (before PR #25454) [2, 30, 58]; vLLM/speculators [3, 31, 59]' for these boundaries."""
    parts = []
    for label, numbering in (
        ("SGLang before PR #25454", Numbering.SGLANG_LEGACY),
        ("SGLang with PR #25454", Numbering.SGLANG_PR25454),
        ("vLLM/speculators", Numbering.VLLM),
    ):
        try:
            ids = from_boundaries(boundaries, numbering, num_layers)
            parts.append(f"{label} {fmt_list(ids)}")
        except BoundaryError as e:
            parts.append(f"{label}: not expressible ({str(e).splitlines()[0]})")
    return "eagle_aux_hidden_state_layer_ids for " + "; ".join(parts)
