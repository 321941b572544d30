"""Boundary indices and every engine's layer-id numbering: the only place that adds or subtracts 1.

A **boundary** `b` is the residual stream after `b` decoder layers: `b = 0` is the embedding
output, `b = L` the last decoder layer's output before the final norm. "Output of decoder
layer k" (0-based) is boundary k + 1. Each engine names the same physical states with its own
ids; this module converts both ways and refuses conversions two readings would resolve
differently.

| numbering          | who                                  | id i means              |
|--------------------|--------------------------------------|-------------------------|
| boundary           | eaglewire, vLLM, speculators         | boundary i              |
| sglang-legacy      | SGLang before PR #25454              | boundary i + 1          |
| sglang-pr25454     | SGLang with PR #25454 (2026-05-16)   | i + 1 if ids[0] == 1,   |
|                    |                                      | else boundary i         |
| specforge/modelopt | SpecForge, NVIDIA ModelOpt           | boundary i + 1          |
| eagle              | EAGLE official code (hard-coded)     | always {2, L//2, L-3}   |
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from eaglewire.errors import BoundaryError

# What "output of layer k" adds to k to become a boundary. Named so nobody writes a bare 1.
LAYER_OUTPUT_OFFSET = 1
# EAGLE-3's low aux state: the output of decoder layer 1.
DEFAULT_LOW_BOUNDARY = 2
# EAGLE-3's high aux state sits this many boundaries below the last one.
DEFAULT_HIGH_MARGIN = 3


class Numbering(enum.StrEnum):
    BOUNDARY = "boundary"
    VLLM = "vllm"
    SPECULATORS = "speculators"
    SGLANG_LEGACY = "sglang-legacy"
    SGLANG_PR25454 = "sglang-pr25454"
    SPECFORGE = "specforge"
    MODELOPT = "modelopt"
    EAGLE = "eagle"


# The user-facing `--from sglang` means "SGLang, generation not stated": both readings are shown.
SGLANG_ANY = "sglang"
SGLANG_GENERATIONS = {
    "legacy": Numbering.SGLANG_LEGACY,
    "pr25454": Numbering.SGLANG_PR25454,
}
SGLANG_GENERATION_HELP = (
    "SGLang releases before PR #25454 (merged 2026-05-16) always add 1 to every id; releases "
    "that include it add 1 only when the first id is 1 and otherwise read the ids as boundaries"
)

NUMBERING_DESCRIPTIONS: dict[Numbering, str] = {
    Numbering.BOUNDARY: "eaglewire boundary: residual stream after b decoder layers",
    Numbering.VLLM: "vLLM top-level eagle_aux_hidden_state_layer_ids: id = boundary (L = last layer output, pre-norm)",
    Numbering.SPECULATORS: "speculators eagle_aux_hidden_state_layer_ids: id = boundary",
    Numbering.SGLANG_LEGACY: "SGLang before PR #25454: eagle_config.eagle_aux_hidden_state_layer_ids, id i = output of layer i",
    Numbering.SGLANG_PR25454: "SGLang with PR #25454: +1 only when the first id is 1, else id = boundary",
    Numbering.SPECFORGE: "SpecForge layer ids: id i = output of layer i",
    Numbering.MODELOPT: "ModelOpt layer ids: id i = output of layer i",
    Numbering.EAGLE: "EAGLE official code: hard-coded boundaries {2, L//2, L-3}, no ids",
}


NUMBERING_SHORT: dict[Numbering, str] = {
    Numbering.BOUNDARY: "id = boundary",
    Numbering.VLLM: "id = boundary",
    Numbering.SPECULATORS: "id = boundary",
    Numbering.SGLANG_LEGACY: "id = layer whose output it is",
    Numbering.SGLANG_PR25454: "layer if first id is 1, else boundary",
    Numbering.SPECFORGE: "id = layer whose output it is",
    Numbering.MODELOPT: "id = layer whose output it is",
    Numbering.EAGLE: "hard-coded {2, L//2, L-3}",
}


def parse_numbering(name: str) -> Numbering:
    try:
        return Numbering(name)
    except ValueError:
        known = ", ".join(n.value for n in Numbering)
        raise BoundaryError(
            f"unknown numbering {name!r}; known: {known}, or 'sglang' with a generation"
        ) from None


def default_boundaries(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default aux boundaries `[2, L//2, L-3]` (the same physical states every engine uses)."""
    picked = (DEFAULT_LOW_BOUNDARY, num_layers // 2, num_layers - DEFAULT_HIGH_MARGIN)
    if (
        len(set(picked)) != len(picked)
        or not all(0 < b < num_layers for b in picked)
        or list(picked) != sorted(picked)
    ):
        raise BoundaryError(
            f"a target with {num_layers} decoder layers is too shallow for three distinct default aux "
            f"boundaries (2, L//2, L-3 = {picked})",
            fix="pass --aux-boundaries explicitly with distinct values in 0..L",
        )
    return picked


def all_boundaries(num_layers: int) -> range:
    """Every boundary of an L-layer target: 0 (embedding output) .. L (last layer output)."""
    return range(num_layers + 1)  # inclusive of L


def validate_boundaries(
    boundaries: Sequence[int], num_layers: int, *, what: str = "aux boundaries"
) -> tuple[int, ...]:
    """Boundaries must be ints in 0..L without duplicates; order is kept (it is the concat order)."""
    out = tuple(int(b) for b in boundaries)
    if not out:
        raise BoundaryError(f"{what}: empty list")
    bad = [b for b in out if not 0 <= b <= num_layers]
    if bad:
        raise BoundaryError(
            f"{what} {list(out)}: {bad} out of range 0..{num_layers} (L = {num_layers} decoder layers)"
        )
    dupes = sorted({b for b in out if out.count(b) > 1})
    if dupes:
        raise BoundaryError(
            f"{what} {list(out)}: duplicated {dupes}; each aux state must be a distinct boundary"
        )
    return out


def describe_boundary(b: int, num_layers: int) -> str:
    """'embedding output', 'output of layer 2', or 'output of layer 29 (last, pre-norm)'."""
    if b == 0:
        return "embedding output"
    layer = b - LAYER_OUTPUT_OFFSET
    if b == num_layers:
        return f"output of layer {layer} (last layer, pre-norm)"
    return f"output of layer {layer}"


def boundary_of_layer_output(layer: int) -> int:
    """Decoder layer `layer` (0-based) writes boundary `layer + 1`."""
    return layer + LAYER_OUTPUT_OFFSET


def _shift(ids: Sequence[int], delta: int) -> tuple[int, ...]:
    return tuple(int(i) + delta for i in ids)


def to_boundaries(ids: Sequence[int] | None, numbering: Numbering, num_layers: int) -> tuple[int, ...]:
    """Read engine ids as boundaries. `ids=None` means the engine's defaults."""
    if ids is None or numbering is Numbering.EAGLE:
        if numbering is Numbering.EAGLE and ids is not None:
            raise BoundaryError(
                f"EAGLE's official code takes no layer ids (it hard-codes boundaries {{2, L//2, L-3}}); got {list(ids)}"
            )
        return default_boundaries(num_layers)
    if numbering in (Numbering.BOUNDARY, Numbering.VLLM, Numbering.SPECULATORS):
        out = tuple(int(i) for i in ids)
    elif numbering in (Numbering.SGLANG_LEGACY, Numbering.SPECFORGE, Numbering.MODELOPT):
        out = _shift(ids, LAYER_OUTPUT_OFFSET)
    elif numbering is Numbering.SGLANG_PR25454:
        out = _shift(ids, LAYER_OUTPUT_OFFSET) if ids and int(ids[0]) == 1 else tuple(int(i) for i in ids)
    else:  # pragma: no cover - enum is exhaustive
        raise BoundaryError(f"unhandled numbering {numbering}")
    return validate_boundaries(out, num_layers, what=f"{numbering.value} ids {list(ids)} read as boundaries")


def from_boundaries(
    boundaries: Sequence[int], numbering: Numbering, num_layers: int
) -> tuple[int, ...] | None:
    """Write boundaries in an engine's ids. Returns None for EAGLE (no ids: it uses its defaults).

    Raises when the engine cannot express the boundaries (SGLang cannot capture the embedding,
    boundary 0; EAGLE cannot take anything but its defaults).
    """
    bs = validate_boundaries(boundaries, num_layers)
    if numbering in (Numbering.BOUNDARY, Numbering.VLLM, Numbering.SPECULATORS):
        return bs
    if numbering is Numbering.EAGLE:
        if bs != default_boundaries(num_layers):
            raise BoundaryError(
                f"EAGLE's official code hard-codes boundaries {list(default_boundaries(num_layers))}; "
                f"cannot express {list(bs)}",
                fix="export to sglang or vllm instead, or use the default boundaries",
            )
        return None
    if 0 in bs and numbering in (Numbering.SGLANG_LEGACY, Numbering.SGLANG_PR25454):
        raise BoundaryError(
            f"boundary 0 (the embedding output) in {list(bs)}: stock SGLang cannot capture it (the field "
            "reports' '-1' id is a local patch, not SGLang)",
            fix="train the draft on layer outputs (boundaries >= 1), e.g. the defaults "
            + str(list(default_boundaries(num_layers))),
        )
    if numbering in (Numbering.SGLANG_LEGACY, Numbering.SPECFORGE, Numbering.MODELOPT):
        return _shift(bs, -LAYER_OUTPUT_OFFSET)
    if numbering is Numbering.SGLANG_PR25454:
        layer_ids = _shift(bs, -LAYER_OUTPUT_OFFSET)
        if layer_ids[0] == 1:  # first aux state is the output of layer 1: the +1 reading applies
            return layer_ids
        if bs[0] == 1:
            raise BoundaryError(
                f"boundaries {list(bs)} start at 1 (output of layer 0): SGLang with PR #25454 reads a first id "
                "of 1 as 'output of layer 1' (boundary 2), so no id list expresses this",
                fix="use --sglang-generation legacy with a release before PR #25454, or move the first boundary",
            )
        return bs
    raise BoundaryError(f"unhandled numbering {numbering}")  # pragma: no cover


@dataclass(frozen=True)
class SGLangReading:
    """How both SGLang generations read one id list."""

    ids: tuple[int, ...]
    legacy: tuple[int, ...] | None
    pr25454: tuple[int, ...] | None
    legacy_error: str | None = None
    pr25454_error: str | None = None

    @property
    def ambiguous(self) -> bool:
        return self.legacy != self.pr25454


def read_sglang_both(ids: Sequence[int], num_layers: int) -> SGLangReading:
    readings: dict[str, tuple[int, ...] | None] = {}
    errors: dict[str, str | None] = {}
    for gen, numbering in SGLANG_GENERATIONS.items():
        try:
            readings[gen] = to_boundaries(ids, numbering, num_layers)
            errors[gen] = None
        except BoundaryError as e:
            readings[gen] = None
            errors[gen] = str(e)
    return SGLangReading(
        ids=tuple(int(i) for i in ids),
        legacy=readings["legacy"],
        pr25454=readings["pr25454"],
        legacy_error=errors["legacy"],
        pr25454_error=errors["pr25454"],
    )


def sglang_ids_unambiguous(boundaries: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """SGLang ids that both generations read as `boundaries`, or an error explaining why none exist."""
    legacy = from_boundaries(boundaries, Numbering.SGLANG_LEGACY, num_layers)
    assert legacy is not None
    both = read_sglang_both(legacy, num_layers)
    if both.ambiguous:
        raise BoundaryError(
            f"SGLang ids {list(legacy)} for boundaries {list(boundaries)} are read as {list(both.legacy or ())} by "
            f"releases before PR #25454 and as {list(both.pr25454 or ())} by releases with it ({SGLANG_GENERATION_HELP})",
            fix="name the SGLang generation you serve with (--sglang-generation legacy|pr25454), or start the aux "
            "boundaries at 2 (output of layer 1), which both generations read alike",
        )
    return legacy


def engine_ids_table(boundaries: Sequence[int], num_layers: int) -> dict[str, tuple[int, ...] | str]:
    """Ids to write for every engine/tool for these boundaries (or the reason none exist)."""
    table: dict[str, tuple[int, ...] | str] = {}
    for numbering in Numbering:
        try:
            ids = from_boundaries(boundaries, numbering, num_layers)
            table[numbering.value] = "(hard-coded defaults; no ids)" if ids is None else ids
        except BoundaryError as e:
            table[numbering.value] = f"not expressible: {str(e).splitlines()[0]}"
    return table
