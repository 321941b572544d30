"""Boundary indices and every engine's layer-id numbering: the only place that adds or subtracts 1.
(Over 500 lines on purpose: most of it is the cited table of engine rules, which is one concern.)

A **boundary** `b` is the residual stream after `b` decoder layers: `b = 0` is the embedding
output, `b = L` the last decoder layer's output before the final norm. "Output of decoder
layer k" (0-based) is boundary k + 1.

Two kinds of numbering live here:

- **id rules** (`Numbering`): what an id means, e.g. `layer-output` (id i = output of layer i =
  boundary i + 1). `to_boundaries` / `from_boundaries` convert with a rule.
- **the engine table** (`ENGINE_RULES`): which rule SGLang and vLLM apply, per engine release
  range *and* target architecture, and which boundaries their capture can reach, each row read
  from the engine's released code (version, file and line cited in the row). `engine_ids` writes
  ids for the release the user names, or ids that every release read so far reads alike (else it
  refuses, showing each release's reading); `read_engine_ids` says what a release will capture.

Both engines concatenate aux states in layer order, whatever order the ids are written in (SGLang
appends inside its layer loop; vLLM 0.33.0 sorts the ids, `model_executor/models/interfaces.py:1617`),
so only increasing boundaries reach the draft in the order it was trained on.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from eaglewire.errors import BoundaryError, ConfigError

# What "output of layer k" adds to k to become a boundary. Named so nobody writes a bare 1.
LAYER_OUTPUT_OFFSET = 1
# EAGLE-3's low aux state: the output of decoder layer 1.
DEFAULT_LOW_BOUNDARY = 2
# EAGLE-3's high aux state sits this many boundaries below the last one.
DEFAULT_HIGH_MARGIN = 3


class Numbering(enum.StrEnum):
    """What one id means (an id rule). Engines pick a rule per release and architecture: `ENGINE_RULES`."""

    BOUNDARY = "boundary"
    VLLM = "vllm"
    SPECULATORS = "speculators"
    LAYER_OUTPUT = "layer-output"
    PR25454 = "pr25454"
    SPECFORGE = "specforge"
    MODELOPT = "modelopt"
    EAGLE = "eagle"


BOUNDARY_RULES = frozenset({Numbering.BOUNDARY, Numbering.VLLM, Numbering.SPECULATORS})
LAYER_RULES = frozenset({Numbering.LAYER_OUTPUT, Numbering.SPECFORGE, Numbering.MODELOPT})

NUMBERING_DESCRIPTIONS: dict[Numbering, str] = {
    Numbering.BOUNDARY: "eaglewire boundary: residual stream after b decoder layers",
    Numbering.VLLM: "vLLM top-level eagle_aux_hidden_state_layer_ids: id = boundary (L = last layer output, pre-norm)",
    Numbering.SPECULATORS: "speculators eagle_aux_hidden_state_layer_ids: id = boundary",
    Numbering.LAYER_OUTPUT: "id i = output of layer i = boundary i + 1 (SGLang's Llama/Mistral/Qwen targets)",
    Numbering.PR25454: "SGLang PR #25454 (DeepSeek-V2/V3, GLM-4-MoE-Lite from 0.5.13): +1 only when the first id "
    "is 1, else id = boundary",
    Numbering.SPECFORGE: "SpecForge layer ids: id i = output of layer i",
    Numbering.MODELOPT: "ModelOpt layer ids: id i = output of layer i",
    Numbering.EAGLE: "EAGLE official code: hard-coded boundaries {2, L//2, L-3}, no ids",
}

NUMBERING_SHORT: dict[Numbering, str] = {
    Numbering.BOUNDARY: "id = boundary",
    Numbering.VLLM: "id = boundary",
    Numbering.SPECULATORS: "id = boundary",
    Numbering.LAYER_OUTPUT: "id = layer whose output it is",
    Numbering.PR25454: "layer if first id is 1, else boundary",
    Numbering.SPECFORGE: "id = layer whose output it is",
    Numbering.MODELOPT: "id = layer whose output it is",
    Numbering.EAGLE: "hard-coded {2, L//2, L-3}",
}


def parse_numbering(name: str, *, flag: str = "--numbering") -> Numbering:
    """An id rule by name; `flag` is the option it came from (the fix names what to use instead)."""
    try:
        return Numbering(name)
    except ValueError:
        known = ", ".join(n.value for n in Numbering)
        instead = (
            "--from sglang with --arch (and --sglang-version)"
            if flag == "--from"
            else "--sglang-version: the rule follows from the release and the target's architecture"
        )
        raise BoundaryError(
            f"{flag} {name}: unknown numbering; known: {known} (SGLang's depends on the release and the target "
            "architecture)",
            fix=f"for SGLang ids use {instead}",
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


def _apply(ids: Sequence[int], numbering: Numbering) -> tuple[int, ...]:
    """The boundaries an id rule names (no range check: engines apply the rule blindly)."""
    if numbering in BOUNDARY_RULES:
        return tuple(int(i) for i in ids)
    if numbering in LAYER_RULES:
        return _shift(ids, LAYER_OUTPUT_OFFSET)
    if numbering is Numbering.PR25454:
        return _shift(ids, LAYER_OUTPUT_OFFSET) if ids and int(ids[0]) == 1 else tuple(int(i) for i in ids)
    raise BoundaryError(f"unhandled numbering {numbering}")  # pragma: no cover - EAGLE handled by callers


def to_boundaries(ids: Sequence[int] | None, numbering: Numbering, num_layers: int) -> tuple[int, ...]:
    """Read ids written in an id rule as boundaries. `ids=None` means the tool's defaults."""
    if ids is None or numbering is Numbering.EAGLE:
        if numbering is Numbering.EAGLE and ids is not None:
            raise BoundaryError(
                f"EAGLE's official code takes no layer ids (it hard-codes boundaries {{2, L//2, L-3}}); got {list(ids)}"
            )
        return default_boundaries(num_layers)
    out = _apply(ids, numbering)
    return validate_boundaries(out, num_layers, what=f"{numbering.value} ids {list(ids)} read as boundaries")


def from_boundaries(
    boundaries: Sequence[int], numbering: Numbering, num_layers: int
) -> tuple[int, ...] | None:
    """Write boundaries in an id rule. Returns None for EAGLE (no ids: it uses its defaults).

    Raises when the rule cannot express the boundaries (PR #25454 cannot start at boundary 1;
    EAGLE takes nothing but its defaults). Whether an engine can *capture* them is `engine_ids`'."""
    bs = validate_boundaries(boundaries, num_layers)
    if numbering in BOUNDARY_RULES:
        return bs
    if numbering is Numbering.EAGLE:
        if bs != default_boundaries(num_layers):
            raise BoundaryError(
                f"EAGLE's official code hard-codes boundaries {list(default_boundaries(num_layers))}; "
                f"cannot express {list(bs)}",
                fix="export to sglang or vllm instead, or use the default boundaries",
            )
        return None
    layer_ids = _shift(bs, -LAYER_OUTPUT_OFFSET)
    if numbering in LAYER_RULES:
        return layer_ids
    if numbering is Numbering.PR25454:
        if layer_ids[0] == 1:  # first aux state is the output of layer 1: the +1 reading applies
            return layer_ids
        if bs[0] == 1:
            raise BoundaryError(
                f"boundaries {list(bs)} start at 1 (output of layer 0): the PR #25454 rule reads a first id of 1 as "
                "'output of layer 1' (boundary 2) and any other first id as a boundary, so no id list expresses this",
                fix="move the first aux boundary (eaglewire draft init --aux-boundaries)",
            )
        return bs
    raise BoundaryError(f"unhandled numbering {numbering}")  # pragma: no cover


# --- the engine table -------------------------------------------------------------------------


class Engine(enum.StrEnum):
    SGLANG = "sglang"
    VLLM = "vllm"


ENGINE_NAMES = {Engine.SGLANG: "SGLang", Engine.VLLM: "vLLM"}
VERSION_FLAGS = {Engine.SGLANG: "--sglang-version", Engine.VLLM: "--vllm-version"}

# Hugging Face architecture class -> the family the engine table is keyed by.
ARCHITECTURE_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3-moe",
    "DeepseekV2ForCausalLM": "deepseek-v2",
    "DeepseekV3ForCausalLM": "deepseek-v3",
    "Glm4MoeLiteForCausalLM": "glm4-moe-lite",
}
FAMILIES = tuple(dict.fromkeys(ARCHITECTURE_FAMILIES.values()))


@dataclass(frozen=True, order=True)
class Version:
    """An engine release, compared numerically (0.5.9 < 0.5.10); suffixes (.post1, rc, +local) are dropped."""

    parts: tuple[int, ...]

    def __str__(self) -> str:
        return ".".join(map(str, self.parts))


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[A-Za-z0-9.+-]*)?$")


def parse_version(text: str | Version, *, flag: str = "version") -> Version:
    if isinstance(text, Version):
        return text
    m = _VERSION.match(str(text).strip())
    if m is None:
        raise ConfigError(f"{flag}: expected a release number such as 0.5.23, got {text!r}")
    return Version(tuple(int(g) for g in m.groups(default="0")))


def family_of(architecture: str) -> str:
    """'Qwen3ForCausalLM' (or the family name 'qwen3') -> 'qwen3'; unknown names are refused."""
    if architecture in ARCHITECTURE_FAMILIES:
        return ARCHITECTURE_FAMILIES[architecture]
    name = architecture.strip().lower().replace("_", "-")
    if name in FAMILIES:
        return name
    raise BoundaryError(
        f"architecture {architecture!r}: not in eaglewire's engine table; known: "
        f"{', '.join(ARCHITECTURE_FAMILIES)} (or the families {', '.join(FAMILIES)})",
        fix="pass the target's config.json architectures[0] with --arch",
    )


V = Version


@dataclass(frozen=True)
class EngineRule:
    """How one engine release range reads layer ids for some target architectures, and what it can capture."""

    engine: Engine
    first: Version  # the oldest release read for this row
    last: Version  # the newest release read for this row (inclusive)
    families: frozenset[str]
    numbering: Numbering | None  # None: the engine does not serve EAGLE-3 drafts for these targets
    source: str  # where the id rule was read: release, file, line
    embedding: str | None = None  # None: captures boundary 0; else why it cannot
    last_layer: str | None = None  # None: captures boundary L; else why it cannot
    unsupported: str | None = None  # why no EAGLE-3 at all (numbering None)

    @property
    def versions(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    @property
    def label(self) -> str:
        return f"{ENGINE_NAMES[self.engine]} {self.versions}"

    def covers(self, version: Version) -> bool:
        return self.first <= version <= self.last


_SG_LAST = (
    "its layer loop `for i in range(self.start_layer, self.end_layer)` captures at the entry of layer i, so "
    "capture point L is never reached and the final norm is applied without a capture"
)
_SG_LAST_LLAMA = f"{_SG_LAST} (models/llama.py:486 in 0.5.23, :393 in 0.5.12)"
_SG_LAST_QWEN = f"{_SG_LAST} (models/qwen2.py:456, qwen3.py:524 in 0.5.23; qwen2.py:361 in 0.5.12)"
_SG_LAST_DEEPSEEK = (
    f"{_SG_LAST} (models/deepseek_v2.py:3176, glm4_moe_lite.py:648 in 0.5.23; deepseek_v2.py:2267 in 0.5.12)"
)
_SG_LAST_MOE = (
    "Qwen2MoeModel.set_eagle3_layers_to_capture flags `self.layers[layer_id]` for each capture point, and "
    "self.layers[L] does not exist: the server stops with an IndexError (models/qwen2_moe.py:1155-1156 in 0.5.23, "
    ":773-774 in 0.5.12)"
)
_SG_EMBED_CRASH = (
    "before layer 0 it computes `hidden_states + residual` while residual is still None: capture point 0 stops "
    "the server with a TypeError"
)
_SG_LAYER_OUTPUT_SRC = (
    "set_eagle3_layers_to_capture: `layers_to_capture = [val + 1 for val in layer_ids]` (models/llama.py:941, "
    "qwen2.py:794, qwen3.py:791, qwen3_moe.py:1143 in 0.5.23; llama.py:810, qwen2.py:657, qwen3.py:695, "
    "qwen3_moe.py:1095 in 0.5.12; Mistral reuses LlamaForCausalLM), captured at the entry of layer val + 1"
)
_SG_PR25454_SRC = (
    "set_eagle3_layers_to_capture: +1 only when `layer_ids[0] == 1`, else the ids as capture points (PR #25454; "
    "models/deepseek_v2.py:3470-3473, glm4_moe_lite.py:817-820 in 0.5.23; first in 0.5.13)"
)
_SG_EMBED_OK = (
    "boundary 0 is captured: stage.py's `capture_before_read` takes the embedding when the residual stream has "
    "not started (layers/layer_boundary/stage.py:421-434 in 0.5.23)"
)

ENGINE_RULES: tuple[EngineRule, ...] = (
    EngineRule(
        Engine.SGLANG, V((0, 5, 10)), V((0, 5, 21)), frozenset({"llama", "mistral"}), Numbering.LAYER_OUTPUT,
        _SG_LAYER_OUTPUT_SRC,
        embedding=f"LlamaModel.forward {_SG_EMBED_CRASH} (models/llama.py:388 in 0.5.10, :395 in 0.5.12, :441 in "
        "0.5.21)",
        last_layer=_SG_LAST_LLAMA,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 22)), V((0, 5, 23)), frozenset({"llama", "mistral"}), Numbering.LAYER_OUTPUT,
        f"{_SG_LAYER_OUTPUT_SRC}; {_SG_EMBED_OK}",
        last_layer=_SG_LAST_LLAMA,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 10)), V((0, 5, 23)), frozenset({"qwen2", "qwen3"}), Numbering.LAYER_OUTPUT,
        f"{_SG_LAYER_OUTPUT_SRC}; boundary 0 is captured (qwen2.py:364 in 0.5.12 skips the None residual; Qwen3 "
        "used Qwen2Model.forward until 0.5.20)",
        last_layer=_SG_LAST_QWEN,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 10)), V((0, 5, 23)), frozenset({"qwen3-moe"}), Numbering.LAYER_OUTPUT,
        f"{_SG_LAYER_OUTPUT_SRC}; boundary 0 is captured (the layer captures its residual after prepare_attn, "
        "which is the embedding at layer 0)",
        last_layer=_SG_LAST_MOE,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 10)), V((0, 5, 12)), frozenset({"deepseek-v2", "deepseek-v3", "glm4-moe-lite"}),
        Numbering.LAYER_OUTPUT,
        "before PR #25454: DeepseekV2ForCausalLM.set_eagle3_layers_to_capture adds 1 to every id "
        "(models/deepseek_v2.py:2541 in 0.5.12); Glm4MoeLiteForCausalLM inherits it",
        embedding=f"DeepseekV2Model.forward {_SG_EMBED_CRASH} (models/deepseek_v2.py:2282 in 0.5.12)",
        last_layer=_SG_LAST_DEEPSEEK,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 13)), V((0, 5, 13)), frozenset({"deepseek-v2", "deepseek-v3"}), Numbering.PR25454,
        _SG_PR25454_SRC,
        embedding=f"DeepseekV2Model.forward {_SG_EMBED_CRASH} (models/deepseek_v2.py:2453 in 0.5.13)",
        last_layer=_SG_LAST_DEEPSEEK,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 14)), V((0, 5, 23)), frozenset({"deepseek-v2", "deepseek-v3"}), Numbering.PR25454,
        f"{_SG_PR25454_SRC}; boundary 0 is captured (each layer captures its residual after the input norm, the "
        "embedding at layer 0: deepseek_v2.py:3193 in 0.5.23)",
        last_layer=_SG_LAST_DEEPSEEK,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 13)), V((0, 5, 20)), frozenset({"glm4-moe-lite"}), Numbering.PR25454,
        _SG_PR25454_SRC,
        embedding=f"Glm4MoeLiteModel.forward {_SG_EMBED_CRASH} (models/glm4_moe_lite.py:854 in 0.5.13)",
        last_layer=_SG_LAST_DEEPSEEK,
    ),
    EngineRule(
        Engine.SGLANG, V((0, 5, 21)), V((0, 5, 23)), frozenset({"glm4-moe-lite"}), Numbering.PR25454,
        f"{_SG_PR25454_SRC}; {_SG_EMBED_OK}",
        last_layer=_SG_LAST_DEEPSEEK,
    ),
    EngineRule(
        Engine.VLLM, V((0, 33, 0)), V((0, 33, 0)), frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3-moe"}),
        Numbering.VLLM,
        "the draft's top-level eagle_aux_hidden_state_layer_ids (v1/worker/gpu_model_runner.py:5207, "
        "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:119) are capture points: EagleModelMixin captures before "
        "layer start_layer and after each layer idx as idx + 1 (model_executor/models/llama.py:428-441, "
        "qwen2.py:422-434, qwen3_moe.py:505-515; interfaces.py:1640-1650), boundary 0 and L included",
    ),
    EngineRule(
        Engine.VLLM, V((0, 33, 0)), V((0, 33, 0)), frozenset({"deepseek-v2", "deepseek-v3"}), Numbering.VLLM,
        "ids are capture points: `if idx in self.aux_hidden_state_layers` before layer idx and "
        "`if self.end_layer in ...` after the last (model_executor/models/deepseek_v2.py:1561, :1586)",
        embedding="DeepseekV2Model.forward computes `hidden_states + residual` before layer 0 while residual is "
        "still None (model_executor/models/deepseek_v2.py:1561-1562): capture point 0 stops the server with a "
        "TypeError",
    ),
    EngineRule(
        Engine.VLLM, V((0, 33, 0)), V((0, 33, 0)), frozenset({"glm4-moe-lite"}), None,
        "model_executor/models/glm4_moe_lite.py:543 (Glm4MoeLiteForCausalLM)",
        unsupported="vLLM 0.33.0's Glm4MoeLiteForCausalLM does not implement SupportsEagle3 "
        "(model_executor/models/glm4_moe_lite.py:543): the runner refuses EAGLE-3 with 'Model does not support "
        "EAGLE3 interface' (v1/worker/gpu_model_runner.py:5173)",
    ),
)  # fmt: skip

ORDER_RULE = {
    Engine.SGLANG: "SGLang appends aux states inside its layer loop, so they arrive in layer order whatever order "
    "the ids are written in",
    Engine.VLLM: "vLLM 0.33.0 sorts the ids (`tuple(sorted(set(layers)))`, model_executor/models/interfaces.py:1617) "
    "and captures in layer order",
}


def read_versions(engine: Engine, architecture: str | None = None) -> str:
    """'0.5.10-0.5.23': the releases eaglewire's table covers for this engine (and architecture)."""
    fam = family_of(architecture) if architecture is not None else None
    rows = [r for r in ENGINE_RULES if r.engine is engine and (fam is None or fam in r.families)]
    first, last = min(r.first for r in rows), max(r.last for r in rows)
    return str(first) if first == last else f"{first}-{last}"


def engine_rules(
    engine: Engine | str, architecture: str, version: str | Version | None = None
) -> tuple[EngineRule, ...]:
    """The rows for this engine and target architecture: the one covering `version`, or all (oldest first)."""
    engine = Engine(engine)
    fam = family_of(architecture)
    rows = sorted(
        (r for r in ENGINE_RULES if r.engine is engine and fam in r.families), key=lambda r: r.first
    )
    if version is None:
        return tuple(rows)
    flag = VERSION_FLAGS[engine]
    v = parse_version(version, flag=flag)
    match = [r for r in rows if r.covers(v)]
    if not match:
        raise BoundaryError(
            f"{flag} {v}: {ENGINE_NAMES[engine]} {v} is not in eaglewire's table for {architecture} targets (releases "
            f"read: {read_versions(engine, architecture)}); its numbering was never read, so no id list can be "
            "promised for it",
            fix=f"name the release you serve with if it was read ({flag} {rows[-1].last}), or leave {flag} out to get "
            "ids every release read reads alike",
        )
    return (match[0],)


@dataclass(frozen=True)
class EngineReading:
    """What one engine release range captures for some ids (None ids: its defaults)."""

    rule: EngineRule
    ids: tuple[int, ...] | None
    boundaries: tuple[int, ...] | None  # what it concatenates, in order; None when it cannot serve at all
    problem: str | None = (
        None  # why this is not what the ids ask for (crash, dropped, reordered, unsupported)
    )

    @property
    def label(self) -> str:
        return self.rule.label

    def text(self) -> str:
        """'reads [2, 3, 5] as boundaries [3, 4, 6]' or the problem."""
        shown = "no ids (its defaults)" if self.ids is None else f"ids {list(self.ids)}"
        if self.boundaries is None:
            return f"{self.label}: {shown}: {self.problem}"
        out = f"{self.label}: {shown} -> boundaries {list(self.boundaries)}"
        return out + (f" ({self.problem})" if self.problem else "")


def capturable_boundaries(engine: Engine | str, architecture: str, num_layers: int) -> tuple[int, int] | None:
    """(lowest, highest) boundary that every release read of `engine` captures on this target; None
    when no release serves an EAGLE-3 draft for the architecture."""
    rows = [r for r in engine_rules(engine, architecture) if r.numbering is not None]
    if not rows:
        return None
    lowest = 1 if any(r.embedding for r in rows) else 0  # a release that cannot capture boundary 0
    highest = num_layers - 1 if any(r.last_layer for r in rows) else num_layers  # nor boundary L
    return lowest, highest


def read_engine_ids(rule: EngineRule, ids: Sequence[int] | None, num_layers: int) -> EngineReading:
    """What `rule`'s releases capture for `ids` on an L-layer target (None: the engine's defaults)."""
    L = num_layers
    shown = None if ids is None else tuple(int(i) for i in ids)
    if rule.numbering is None:
        return EngineReading(rule, shown, None, rule.unsupported)
    if shown is None:
        try:
            points = default_boundaries(L)  # both engines' defaults: capture points [2, L//2, L-3]
        except BoundaryError as e:
            return EngineReading(rule, None, None, str(e).splitlines()[0])
    else:
        points = _apply(shown, rule.numbering)
    problems: list[str] = []
    outside = [p for p in points if not 0 <= p <= L]
    if outside:
        problems.append(
            f"capture points {outside} name no boundary of a {L}-layer target (0..{L}): never captured"
        )
    if 0 in points and rule.embedding:
        problems.append(f"boundary 0 (embedding output): {rule.embedding}")
    if L in points and rule.last_layer:
        problems.append(f"boundary {L} = {describe_boundary(L, L)}: {rule.last_layer}")
    dupes = sorted({p for p in points if points.count(p) > 1})
    if dupes:
        problems.append(f"capture points {dupes} named twice: captured once")
    captured = tuple(
        sorted(
            {
                p
                for p in points
                if 0 <= p <= L and not (p == 0 and rule.embedding) and not (p == L and rule.last_layer)
            }
        )
    )
    if len(captured) < len(points):
        problems.append(f"the draft gets {len(captured)} of its {len(points)} aux states")
    if not dupes and not outside and list(points) != sorted(points):
        problems.append(f"ids name boundaries {list(points)} out of layer order: {ORDER_RULE[rule.engine]}")
    return EngineReading(rule, shown, captured, "; ".join(problems) or None)


def engine_readings(
    engine: Engine | str,
    architecture: str,
    ids: Sequence[int] | None,
    num_layers: int,
    version: str | Version | None = None,
) -> tuple[EngineReading, ...]:
    """How the named release (or every release read, oldest first) reads `ids` for this architecture."""
    return tuple(read_engine_ids(r, ids, num_layers) for r in engine_rules(engine, architecture, version))


@dataclass(frozen=True)
class EngineIds:
    """Ids to write for an engine, and how each release range the promise covers reads them."""

    engine: Engine
    ids: tuple[int, ...]
    readings: tuple[EngineReading, ...]
    version: Version | None  # the release named, or None: every release read reads them alike

    @property
    def numbering(self) -> str:
        """What the ids mean and who reads them so, for export.json and the launch script's comment."""
        rules = "/".join(
            sorted({r.rule.numbering.value for r in self.readings if r.rule.numbering is not None})
        )
        name = ENGINE_NAMES[self.engine]
        if self.version is not None:
            return f"{rules} ({name} {self.version}, {self.readings[0].label})"
        return f"{rules} (read alike by every {name} release read: {', '.join(r.rule.versions for r in self.readings)})"


def _writes(rule: EngineRule, bs: tuple[int, ...], L: int) -> tuple[int, ...] | None:
    """The ids this rule needs for `bs`, when its releases capture exactly `bs` in order; else None."""
    if rule.numbering is None:
        return None
    try:
        ids = from_boundaries(bs, rule.numbering, L)
    except BoundaryError:
        return None
    if ids is None:  # pragma: no cover - only EAGLE
        return None
    r = read_engine_ids(rule, ids, L)
    return ids if r.problem is None and r.boundaries == bs else None


def _common_ids(rules: Sequence[EngineRule], bs: tuple[int, ...], L: int) -> tuple[int, ...] | None:
    """One id list that every rule in `rules` reads as `bs` and captures, or None."""
    candidates = [ids for ids in (_writes(r, bs, L) for r in rules) if ids is not None]
    for ids in dict.fromkeys(candidates):
        if all((got := read_engine_ids(r, ids, L)).problem is None and got.boundaries == bs for r in rules):
            return ids
    return None


def engine_ids(
    engine: Engine | str,
    architecture: str,
    boundaries: Sequence[int],
    num_layers: int,
    version: str | Version | None = None,
) -> EngineIds:
    """Ids that make `engine` feed the draft exactly `boundaries`, in order, on this architecture.

    With `version`: that release's row. Without: one id list that every release read for this
    architecture reads alike and captures. Otherwise a BoundaryError shows each release's reading
    (or why it cannot capture a boundary) and names the alternatives."""
    engine = Engine(engine)
    L = num_layers
    bs = validate_boundaries(boundaries, L)
    rules = engine_rules(engine, architecture, version)
    v = parse_version(version, flag=VERSION_FLAGS[engine]) if version is not None else None
    ids = _common_ids(rules, bs, L)
    if ids is None:
        raise _refusal(engine, architecture, bs, L, rules, v)
    return EngineIds(engine, ids, tuple(read_engine_ids(r, ids, L) for r in rules), v)


def _rule_line(rule: EngineRule, bs: tuple[int, ...], L: int) -> str:
    """How one release range fares with `bs`: the ids that work, or what its nearest ids do instead."""
    ids = _writes(rule, bs, L)
    if ids is not None:
        return f"{rule.label} captures them from ids {list(ids)}"
    if rule.numbering is None:
        return f"{rule.label}: {rule.unsupported}"
    try:
        nearest = from_boundaries(bs, rule.numbering, L)
    except BoundaryError as e:
        return f"{rule.label}: {str(e).splitlines()[0]}"
    return read_engine_ids(rule, nearest, L).text()


def _alternatives(engine: Engine, architecture: str, bs: tuple[int, ...], L: int) -> list[str]:
    """Other ways to serve the draft: boundaries the engine can capture, or the other engine's format."""
    alts: list[str] = []
    rows = engine_rules(engine, architecture)
    if L in bs and any(r.last_layer for r in rows):
        moved = tuple(L - 1 if b == L else b for b in bs)
        if len(set(moved)) == len(moved):
            alts.append(
                f"train on boundary {L - 1} ({describe_boundary(L - 1, L)}) instead of {L}: "
                f"eaglewire draft init --aux-boundaries {','.join(map(str, moved))}"
            )
    if 0 in bs and any(r.embedding for r in rows):
        alts.append(
            "train on layer outputs only (boundaries >= 1) with eaglewire draft init --aux-boundaries"
        )
    if list(bs) != sorted(bs):
        alts.append(
            "train with increasing boundaries: eaglewire draft init --aux-boundaries "
            + ",".join(map(str, sorted(bs)))
        )
    other = Engine.VLLM if engine is Engine.SGLANG else Engine.SGLANG
    other_rules = engine_rules(other, architecture)
    if _common_ids(other_rules, bs, L) is not None:
        alts.append(
            f"or eaglewire export --format {other.value}, which every {ENGINE_NAMES[other]} release read captures"
        )
    else:
        good = [r for r in other_rules if _writes(r, bs, L) is not None]
        if good:
            alts.append(
                f"or eaglewire export --format {other.value} {VERSION_FLAGS[other]} {good[-1].last} "
                f"({ENGINE_NAMES[other]} {good[-1].versions} captures them)"
            )
    return alts


def _refusal(
    engine: Engine,
    architecture: str,
    bs: tuple[int, ...],
    L: int,
    rules: tuple[EngineRule, ...],
    version: Version | None,
) -> BoundaryError:
    name, flag = ENGINE_NAMES[engine], VERSION_FLAGS[engine]
    scope = (
        f"{name} {version}"
        if version is not None
        else f"no single id list works for every {name} release eaglewire has read "
        f"({read_versions(engine, architecture)})"
    )
    message = (
        f"aux boundaries {list(bs)} on this {architecture} target (L={L}): {scope}; the draft would not get "
        "exactly these states in this order:\n  " + "\n  ".join(_rule_line(r, bs, L) for r in rules)
    )
    good = [r for r in rules if _writes(r, bs, L) is not None]
    fixes = []
    if good and version is None:
        fixes.append(
            "name the release you serve with: " + " or ".join(f"{flag} {r.last} ({r.versions})" for r in good)
        )
    alts = _alternatives(engine, architecture, bs, L)
    if alts and not fixes and alts[0].startswith("or "):
        alts[0] = alts[0][len("or ") :]
    fixes.extend(alts)
    if not fixes:
        fixes.append(f"see the ids each release needs: eaglewire ids --arch {architecture} --num-layers {L}")
    return BoundaryError(message, fix="; ".join(fixes))


# --- tables for `eaglewire ids` and the quickstart ----------------------------------------------

PLAIN_NUMBERINGS = (
    Numbering.BOUNDARY,
    Numbering.SPECULATORS,
    Numbering.SPECFORGE,
    Numbering.MODELOPT,
    Numbering.EAGLE,
)


@dataclass(frozen=True)
class IdsRow:
    label: str  # "vllm", "sglang 0.5.22-0.5.23", "sglang (qwen2, qwen3)", "specforge"
    ids: tuple[int, ...] | None  # None: not expressible (see `why`) or EAGLE's hard-coded defaults
    why: str  # how the ids read, or why none exist


def _plain_row(numbering: Numbering, bs: Sequence[int], L: int) -> IdsRow:
    try:
        ids = from_boundaries(bs, numbering, L)
    except BoundaryError as e:
        return IdsRow(numbering.value, None, f"not expressible: {str(e).splitlines()[0]}")
    if ids is None:
        return IdsRow(numbering.value, None, "(hard-coded defaults; no ids)")
    return IdsRow(numbering.value, ids, NUMBERING_SHORT[numbering])


def _engine_row(
    label: str, engine: Engine, architecture: str, bs: tuple[int, ...], L: int, version: Version | None
) -> IdsRow:
    rules = engine_rules(engine, architecture, version)
    ids = _common_ids(rules, bs, L)
    if ids is not None:
        used = sorted({r.numbering.value for r in rules if r.numbering is not None})
        return IdsRow(label, ids, ", ".join(NUMBERING_SHORT[Numbering(n)] for n in used))
    reasons = [_rule_line(r, bs, L) for r in rules if _writes(r, bs, L) is None]
    if len(rules) > 1 and len(reasons) < len(rules):
        return IdsRow(label, None, "no id list every release reads alike: name the release (see its row)")
    first = reasons[0].split(": ", 1)[-1] if reasons else "not expressible"
    return IdsRow(label, None, f"not expressible: {first}")


def engine_ids_rows(
    boundaries: Sequence[int], num_layers: int, architecture: str | None = None
) -> list[IdsRow]:
    """The ids every engine/tool needs for these boundaries.

    With an architecture: one row per engine release range (and one for 'any release read').
    Without: one row per group of architectures that get the same ids."""
    bs = validate_boundaries(boundaries, num_layers)
    L = num_layers
    rows: list[IdsRow] = []
    for engine in Engine:
        if architecture is not None:
            family_of(architecture)
            rows.append(_engine_row(f"{engine.value} (any release read)", engine, architecture, bs, L, None))
            for rule in engine_rules(engine, architecture):
                rows.append(
                    _engine_row(f"{engine.value} {rule.versions}", engine, architecture, bs, L, rule.last)
                )
            continue
        groups: dict[tuple[tuple[int, ...] | None, str], list[str]] = {}
        for fam in FAMILIES:
            row = _engine_row("", engine, fam, bs, L, None)
            groups.setdefault((row.ids, row.why), []).append(fam)
        for (ids, why), fams in groups.items():
            rows.append(IdsRow(f"{engine.value} ({', '.join(fams)})", ids, why))
    rows.extend(_plain_row(n, bs, L) for n in PLAIN_NUMBERINGS)
    return rows


def engine_ids_table(
    boundaries: Sequence[int], num_layers: int, architecture: str | None = None
) -> dict[str, tuple[int, ...] | str]:
    """label -> ids to write (or why there are none), for every engine and tool (`engine_ids_rows`)."""
    return {
        r.label: (r.ids if r.ids is not None else r.why)
        for r in engine_ids_rows(boundaries, num_layers, architecture)
    }


def sglang_numbering(architecture: str, version: str | Version) -> Numbering:
    """The id rule SGLang `version` applies on this target architecture."""
    rule = engine_rules(Engine.SGLANG, architecture, version)[0]
    if rule.numbering is None:  # pragma: no cover - every SGLang row has a rule today
        raise BoundaryError(f"{rule.label} on {architecture}: {rule.unsupported}")
    return rule.numbering
