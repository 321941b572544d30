"""The ways a deployment can feed a draft other inputs than it was trained on, each as a replayable wiring.

`eaglewire doctor --served` replays the served text under the draft's declared wiring; when the served
acceptance falls short of that, it replays every candidate here and names the one whose prediction
matches what was served. Each candidate carries the exact change that undoes it (the config key and
value in the served export, or the server flag).

| fault                     | what the engine does                                              |
|---------------------------|-------------------------------------------------------------------|
| aux.shifted               | aux states one boundary later (+1) or earlier (-1): ids written in one numbering, read in the other (SGLang: id = layer output; vLLM/speculators: id = boundary) |
| aux.order                 | the trained aux states in another order (fc's blocks permuted)    |
| aux.embedding_first       | the embedding output (boundary 0) in place of the first aux state |
| aux.embedding_missing     | one state fewer (the embedding dropped): impossible for a draft whose fc reads A states (the engine fails to load it rather than serving it short); replayed never, said so |
| aux.post_norm             | the last layer's state after the final norm (Hugging Face's hidden_states[L]) where the draft was trained on it before (only for drafts that read boundary L) |
| aux.config_reading        | the served export's ids as each engine release reads them (e.g. the other SGLang reading) |
| vocab.d2t_as_absolute     | `d2t` offsets read as absolute target ids (target = d2t[d], not d + d2t[d]) |
| vocab.absolute_as_d2t     | absolute target ids stored in `d2t` and read as offsets (target = d + ids[d]) |
| spec.draft_length         | a draft length the engine silently rewrote (SGLang: topk 1 forces num_draft_tokens = num_steps + 1) |

Pure: no torch, no model. Layer ids are written and read only through `eaglewire.contract.numbering`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eaglewire.contract.numbering import (
    ENGINE_NAMES,
    Engine,
    Numbering,
    describe_boundary,
    engine_ids,
    engine_readings,
    engine_rules,
    from_boundaries,
    read_versions,
    to_boundaries,
)
from eaglewire.engine.spec_args import FLAG, SpecArgs
from eaglewire.errors import BoundaryError, ConfigError

Norm = Literal["pre", "post"]
VocabMap = Literal["trained", "d2t_as_absolute", "absolute_as_d2t"]
ServedFormat = Literal["sglang", "vllm", "eaglewire"]
MAX_PERMUTED_AUX = 4  # every order of up to 4 aux states (23 candidates); more: the reversed order only

IDS_KEY = {
    "sglang": "eagle_config.eagle_aux_hidden_state_layer_ids",
    "vllm": "eagle_aux_hidden_state_layer_ids",
    "eaglewire": "aux_boundaries",
}


@dataclass(frozen=True)
class AuxSource:
    """One state the engine feeds into the draft's fc: a boundary, before (pre) or after (post) the final norm."""

    boundary: int
    norm: Norm = "pre"

    def describe(self, num_layers: int) -> str:
        if self.norm == "post":
            return f"{self.boundary} post-norm (the final norm's output)"
        return f"{self.boundary}"


@dataclass(frozen=True)
class Wiring:
    """What the engine feeds the draft: aux states in fc order, how it maps draft ids, the speculative shape
    (None: the declared one)."""

    aux: tuple[AuxSource, ...]
    vocab_map: VocabMap = "trained"
    spec: SpecArgs | None = None

    @classmethod
    def of(cls, boundaries: Sequence[int], **kwargs: object) -> Wiring:
        return cls(tuple(AuxSource(int(b)) for b in boundaries), **kwargs)  # type: ignore[arg-type]

    @property
    def boundaries(self) -> tuple[int, ...]:
        return tuple(a.boundary for a in self.aux)

    def describe(self, num_layers: int) -> str:
        out = "aux boundaries [" + ", ".join(a.describe(num_layers) for a in self.aux) + "]"
        if self.vocab_map != "trained":
            out += f", vocab map {self.vocab_map}"
        if self.spec is not None:
            s = self.spec
            out += f", num_steps {s.num_steps} topk {s.topk} num_draft_tokens {s.num_draft_tokens}"
        return out


@dataclass(frozen=True)
class Candidate:
    """One miswiring: its fault class, what it means here, the wiring to replay (None: cannot be
    served at all, `impossible` says why) and the change that undoes it."""

    fault: str
    what: str
    wiring: Wiring | None
    fix: str
    impossible: str = ""


@dataclass(frozen=True)
class ServedSetup:
    """What the doctor knows about the deployment (what it was told, and what the server said)."""

    trained: tuple[int, ...]  # the draft's aux boundaries (its contract)
    num_layers: int
    served_format: ServedFormat | None  # the draft format the server reads (None: unknown)
    architecture: str | None = None  # the target's (Hugging Face class): engines read ids per architecture
    config_path: Path | None = None  # the served export's config.json, when known
    config_ids: tuple[int, ...] | None = None  # the ids in it, when known
    requested_spec: tuple[int, int, int] | None = None  # (num_steps, topk, num_draft_tokens) as launched
    effective_spec: SpecArgs | None = None  # what the engine runs for them (SGLang's rewrites applied)
    d2t_file: str | None = None  # where the served d2t lives (export's safetensors), for the fixes
    extra_readings: dict[str, tuple[int, ...]] = field(default_factory=dict)  # label -> boundaries


def fmt(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def where_ids(setup: ServedSetup) -> str:
    fmt_ = setup.served_format or "vllm"
    target = str(setup.config_path) if setup.config_path is not None else "the served export's config.json"
    if fmt_ == "eaglewire":
        target = (
            str(setup.config_path.parent / "contract.json")
            if setup.config_path
            else "the draft's contract.json"
        )
    return f"{IDS_KEY[fmt_]} in {target}"


def _engine(setup: ServedSetup) -> Engine | None:
    return Engine(setup.served_format) if setup.served_format in ("sglang", "vllm") else None


def _plain_rule(engine: Engine) -> Numbering:
    """The id rule when the target's architecture is unknown: vLLM's (id = boundary), SGLang's for Llama,
    Mistral and Qwen targets (id i = output of layer i)."""
    return Numbering.VLLM if engine is Engine.VLLM else Numbering.LAYER_OUTPUT


def ids_fix(setup: ServedSetup) -> str:
    """The one change that makes the engine feed the trained boundaries: the key and its value (the engine
    table of `eaglewire.contract.numbering`, per release and architecture)."""
    trained, L = setup.trained, setup.num_layers
    engine = _engine(setup)
    if setup.served_format == "eaglewire":
        return (
            f"the draft's contract says aux_boundaries {fmt(trained)}: serve that draft unchanged (eaglewire serve "
            "--draft DRAFT reads contract.json)"
        )
    if engine is not None and setup.architecture is not None:
        name, arch = ENGINE_NAMES[engine], setup.architecture
        try:
            written = engine_ids(engine, arch, trained, L)
            return (
                f"set {where_ids(setup)} to {fmt(written.ids)} (every {name} release read, "
                f"{read_versions(engine, arch)}, captures boundaries {fmt(trained)} from them)"
            )
        except BoundaryError as e:
            parts = []
            try:
                for rule in engine_rules(engine, arch):
                    try:
                        ids = engine_ids(engine, arch, trained, L, version=str(rule.last)).ids
                        parts.append(f"{fmt(ids)} for {rule.label}")
                    except BoundaryError as why:
                        parts.append(f"none for {rule.label} ({str(why).splitlines()[0]})")
            except BoundaryError:
                parts = [str(e).splitlines()[0]]
            return f"set {where_ids(setup)} to the ids of the {name} release you serve with: " + "; ".join(
                parts
            )
    if engine is not None:
        try:
            plain = from_boundaries(trained, _plain_rule(engine), L)
        except BoundaryError as e:
            return f"make the export's ids name boundaries {fmt(trained)}: {str(e).splitlines()[0]}"
        meaning = (
            "id = boundary"
            if engine is Engine.VLLM
            else "id i = output of layer i on Llama/Mistral/Qwen targets"
        )
        return f"set {where_ids(setup)} to {fmt(plain or ())} ({ENGINE_NAMES[engine]}: {meaning})"
    vllm = from_boundaries(trained, Numbering.VLLM, L)
    try:
        layer = from_boundaries(trained, Numbering.LAYER_OUTPUT, L)
        sglang = f", eagle_config.eagle_aux_hidden_state_layer_ids {fmt(layer or ())} for SGLang (Llama/Qwen targets)"
    except BoundaryError:
        sglang = ""
    return (
        f"make the export's ids name boundaries {fmt(trained)}: eagle_aux_hidden_state_layer_ids {fmt(vllm or ())} "
        f"for vLLM/speculators{sglang}"
    )


def _shift_reason(delta: int, served_format: ServedFormat | None) -> str:
    if served_format == "sglang":
        return (
            "ids written as boundaries (vLLM/speculators numbering) read by SGLang as layer outputs"
            if delta > 0
            else "ids one too low for SGLang's numbering (id i = output of layer i), or read as boundaries by an "
            "SGLang release with PR #25454 (DeepSeek and GLM-4-MoE-Lite targets)"
        )
    if served_format == "vllm":
        return (
            "ids written as layer outputs (SGLang/SpecForge numbering) read by vLLM as boundaries"
            if delta < 0
            else "ids written one too high for vLLM's numbering (id = boundary)"
        )
    return (
        "ids written in one numbering and read in the other (SGLang: id = output of layer id, "
        "vLLM/speculators: id = boundary)"
    )


def _valid(boundaries: Sequence[int], num_layers: int) -> bool:
    return all(0 <= b <= num_layers for b in boundaries) and len(set(boundaries)) == len(boundaries)


def config_readings(setup: ServedSetup) -> dict[str, tuple[int, ...]]:
    """How each engine release reads the served export's ids (label -> the boundaries it captures, in the
    order it feeds them), where the ids are known: the engine table per release and architecture, or the
    engine's plain id rule when the architecture is not in it."""
    ids, L, engine = setup.config_ids, setup.num_layers, _engine(setup)
    out: dict[str, tuple[int, ...]] = dict(setup.extra_readings)
    if ids is None or engine is None:
        return out
    try:
        if setup.architecture is None:
            raise BoundaryError("architecture unknown")
        for reading in engine_readings(engine, setup.architecture, ids, L):
            if reading.boundaries is not None:
                out[f"{reading.label} reads {fmt(ids)}"] = reading.boundaries
    except BoundaryError:
        with contextlib.suppress(BoundaryError):
            out[f"{ENGINE_NAMES[engine]} reads {fmt(ids)}"] = to_boundaries(ids, _plain_rule(engine), L)
    return out


def aux_candidates(setup: ServedSetup) -> list[Candidate]:
    """Every aux-state miswiring of the trained boundaries (module docstring), replayable or not."""
    trained, L = setup.trained, setup.num_layers
    fix = ids_fix(setup)
    out: list[Candidate] = []
    for label, boundaries in config_readings(setup).items():
        if tuple(boundaries) != tuple(trained) and len(boundaries) == len(trained):
            out.append(
                Candidate(
                    "aux.config_reading",
                    f"{label} as boundaries {fmt(boundaries)}, not the trained {fmt(trained)}",
                    Wiring.of(boundaries),
                    fix,
                )
            )
    for delta in (+1, -1):
        shifted = tuple(b + delta for b in trained)
        if not _valid(shifted, L):
            continue
        out.append(
            Candidate(
                "aux.shifted",
                f"aux states shifted by {delta:+d}: the engine feeds boundaries {fmt(shifted)} for the trained "
                f"{fmt(trained)} ({_shift_reason(delta, setup.served_format)})",
                Wiring.of(shifted),
                fix,
            )
        )
    orders = (
        itertools.permutations(trained)
        if len(trained) <= MAX_PERMUTED_AUX
        else iter([tuple(reversed(trained))])
    )
    for order in orders:
        if tuple(order) == tuple(trained):
            continue
        out.append(
            Candidate(
                "aux.order",
                f"aux states in another order: {fmt(order)} for the trained {fmt(trained)}",
                Wiring.of(order),
                fix,
            )
        )
    if trained[0] != 0 and 0 not in trained:
        swapped = (0, *trained[1:])
        out.append(
            Candidate(
                "aux.embedding_first",
                f"the embedding output (boundary 0) in place of the first aux state: {fmt(swapped)} for the "
                f"trained {fmt(trained)} (an id naming boundary 0: vLLM's 0, or the '-1' of a patched SGLang)",
                Wiring.of(swapped),
                fix + f"; the first state must be boundary {trained[0]} ({describe_boundary(trained[0], L)})",
            )
        )
    width = f"{len(trained)} x target hidden"
    out.append(
        Candidate(
            "aux.embedding_missing",
            f"one aux state fewer than the {len(trained)} the draft reads (e.g. the embedding output dropped)",
            None,
            fix,
            impossible=f"the draft's fc reads {width}: an engine feeding {len(trained) - 1} states fails to load "
            "it or to run its first step; it cannot serve it short, so this is not replayed",
        )
    )
    if L in trained:
        post = tuple(AuxSource(b, "post" if b == L else "pre") for b in trained)
        out.append(
            Candidate(
                "aux.post_norm",
                f"boundary {L} (the last layer's output) taken after the final norm (Hugging Face's "
                f"hidden_states[{L}]), where the draft was trained on it before the norm",
                Wiring(post),
                f"feed the last layer's output before the final norm (vLLM/speculators: id {L} is pre-norm); "
                "check the engine's or patch's capture of the last layer",
            )
        )
    return out


def vocab_candidates(setup: ServedSetup, *, identity_map: bool) -> list[Candidate]:
    """The draft-to-target vocabulary map read the wrong way (module docstring)."""
    trained = Wiring.of(setup.trained)
    file = setup.d2t_file or "the served export's safetensors"
    note = " (this draft's vocabulary is the target's: its d2t is all zeros)" if identity_map else ""
    return [
        Candidate(
            "vocab.d2t_as_absolute",
            "the engine reads d2t's offsets as absolute target ids (target = d2t[d], not d + d2t[d])" + note,
            Wiring(trained.aux, "d2t_as_absolute"),
            f"d2t in {file} holds offsets (target id = draft id + d2t[draft id]), as SGLang and vLLM read it: "
            "serve it with a stock SGLang/vLLM loader, not one that indexes the target vocabulary with d2t",
        ),
        Candidate(
            "vocab.absolute_as_d2t",
            "d2t holds absolute target ids but the engine adds them as offsets (target = d + ids[d])",
            Wiring(trained.aux, "absolute_as_d2t"),
            f"write offsets into d2t in {file} (target id - draft id per draft id): re-export the draft with "
            "`eaglewire export`",
        ),
    ]


def spec_candidates(setup: ServedSetup) -> list[Candidate]:
    """A draft length the engine silently rewrote (SGLang's topk=1 rule), when the launch flags are known."""
    if setup.requested_spec is None or setup.effective_spec is None:
        return []
    steps, topk, ndt = setup.requested_spec
    eff = setup.effective_spec
    if (eff.num_steps, eff.topk, eff.num_draft_tokens) == (steps, topk, ndt):
        return []
    chain = topk == 1 and ndt >= 2
    fix = (
        f"{FLAG['num_steps']} {ndt - 1} {FLAG['topk']} 1 {FLAG['num_draft_tokens']} {ndt} (a chain of {ndt - 1} "
        f"draft tokens), or state what runs: {FLAG['num_draft_tokens']} {eff.num_draft_tokens}"
        if chain
        else f"{FLAG['num_steps']} {eff.num_steps} {FLAG['topk']} {eff.topk} {FLAG['num_draft_tokens']} "
        f"{eff.num_draft_tokens} (what runs)"
    )
    return [
        Candidate(
            "spec.draft_length",
            f"the engine silently runs {FLAG['num_draft_tokens']} {eff.num_draft_tokens} ({eff.num_draft_tokens - 1} "
            f"draft token(s) per verification), not the requested {ndt}",
            Wiring.of(setup.trained, spec=eff),
            fix,
        )
    ]


def declared_spec(requested: tuple[int, int, int] | None, observed: SpecArgs | None) -> SpecArgs:
    """The speculative shape the served acceptance is predicted for: what was asked for (a topk-1 request of
    num_draft_tokens N means a chain of N - 1 drafts, whatever SGLang makes of it), else what the server runs."""
    if requested is not None:
        steps, topk, ndt = requested
        if topk == 1:
            return SpecArgs.chain(max(1, ndt - 1))
        try:
            return SpecArgs(steps, topk, ndt)
        except ConfigError:
            pass
    if observed is None:
        raise ConfigError(
            "the served draft length is unknown (the server reported no drafted tokens)",
            fix="pass the server's launch arguments with --sglang-args or --vllm-config",
        )
    return observed


def all_candidates(setup: ServedSetup, *, identity_map: bool) -> list[Candidate]:
    return [
        *aux_candidates(setup),
        *vocab_candidates(setup, identity_map=identity_map),
        *spec_candidates(setup),
    ]
