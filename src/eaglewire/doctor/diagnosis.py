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
from eaglewire.contract.numbering import Engine, describe_boundary, engine_ids
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
    declared_name: str = "its label",
    actual_name: str = "the data",
) -> str:
    """One sentence naming the fault that turns `declared` aux boundaries into `actual` ones.

    `declared_name`/`actual_name` say whose they are ("its label"/"the data" for a dataset,
    "training"/"the engine" for serving).
    """
    if any(a is None for a in actual):
        bad = [i for i, a in enumerate(actual) if a is None]
        return (
            f"aux column(s) {bad} match no boundary of this target (another target, another dtype, "
            "states captured on different tokens, or corrupted data)"
        )
    act = [int(a) for a in actual if a is not None]
    dec = list(declared)
    emb = EMBEDDING_BOUNDARY
    if len(act) != len(dec):
        extra = len(act) - len(dec)
        if extra > 0 and emb in act and emb not in dec:
            return f"{actual_name} has {extra} more column(s) than {declared_name}: an extra embedding column (boundary 0)"
        if extra < 0 and emb in dec and emb not in act:
            return f"{actual_name} has {-extra} fewer column(s) than {declared_name}: the embedding column is missing"
        return f"{actual_name} has {len(act)} aux column(s), {declared_name} has {len(dec)}"
    if act == dec:
        return f"aux columns match {declared_name}"
    if sorted(act) == sorted(dec):
        return "the same boundaries in a different order (swapped columns)"
    if dec and dec[0] == emb and act[:-1] == dec[1:]:
        tail = (
            ", and the last aux column holds what is labelled final (the field reports' mislabelled dump)"
            if declared_final is not None and actual_final is not None and act[-1] == declared_final.boundary
            else ""
        )
        return (
            f"one column off: {actual_name} has no embedding column; each column holds what {declared_name} "
            f"names for the next one{tail}"
        )
    if act and act[0] == emb and act[1:] == dec[:-1]:
        return (
            f"one column off: {actual_name} prepends an embedding column (boundary 0) and drops the last one, so "
            f"every column arrives in the slot {declared_name} gives the one before it"
        )
    shift = _constant_shift(dec, act)
    if shift is not None:
        return (
            f"every column is {abs(shift)} boundar{'y' if abs(shift) == 1 else 'ies'} "
            f"{'deeper' if shift > 0 else 'shallower'} than in {declared_name}: layer ids read in the wrong numbering "
            "(e.g. 'output of layer i' ids read as boundaries, or the reverse)"
        )
    if emb in act and emb not in dec:
        return f"{actual_name} has an embedding column (boundary 0) that {declared_name} does not"
    if emb in dec and emb not in act:
        return f"the column {declared_name} calls 'embedding output' is not the embedding in {actual_name}"
    return f"aux columns of {actual_name} are other boundaries than {declared_name} says"


def engine_ids_hint(boundaries: Sequence[int], num_layers: int, architecture: str | None = None) -> str:
    """'eagle_aux_hidden_state_layer_ids for SGLang [2, 30, 58]; vLLM/speculators [3, 31, 59]' for these
    boundaries on this target architecture (SGLang's ids depend on it and on the release: `eaglewire ids`)."""
    if architecture is None:
        return (
            f"vLLM/speculators eagle_aux_hidden_state_layer_ids {fmt_list(boundaries)}; SGLang's depend on the "
            f"release and the target: see `eaglewire ids --num-layers {num_layers} --arch ARCH`"
        )
    parts = []
    for label, engine in (("SGLang", Engine.SGLANG), ("vLLM/speculators", Engine.VLLM)):
        try:
            parts.append(f"{label} {fmt_list(engine_ids(engine, architecture, boundaries, num_layers).ids)}")
        except BoundaryError as e:
            first = str(e).splitlines()[0]
            parts.append(f"{label}: per release ({first}; see `eaglewire ids --arch {architecture}`)")
    return "eagle_aux_hidden_state_layer_ids for " + "; ".join(parts)
