"""The hidden-state contract: which target, which boundaries in which order, which final state.

Saved as `contract.json` beside every dataset, checkpoint and export. Two stages that hold
equal contracts (ignoring the fingerprint's numbers) see the same tensors; `diff` names each
field that differs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from eaglewire.contract.fingerprint import Fingerprint, NormSide
from eaglewire.contract.numbering import describe_boundary, validate_boundaries
from eaglewire.errors import ConfigError, ContractMismatchError
from eaglewire.io_utils import atomic_write_json
from eaglewire.typed_config import from_dict, help_field, read_json_file, to_dict

SCHEMA_VERSION = 1
CONTRACT_FILE = "contract.json"
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TargetIdentity:
    architecture: str = help_field("Hugging Face architecture class, e.g. LlamaForCausalLM")
    num_layers: int = help_field("number of decoder layers L")
    hidden_size: int = help_field("target hidden size Ht")
    vocab_size: int = help_field("target vocabulary size V")
    config_hash: str = help_field("sha256 of the target config (volatile keys removed)")
    tokenizer_hash: str = help_field("sha256 of the tokenizer's vocabulary and special tokens")
    chat_template_hash: str = help_field("sha256 of the chat template text, or 'none'")
    name: str = help_field("where the target was loaded from (informational, not compared)", default="")


# The identity fields a draft and a live target must agree on (`name` is informational).
IDENTITY_KEYS = tuple(f.name for f in fields(TargetIdentity) if f.name != "name")


@dataclass(frozen=True)
class FinalState:
    boundary: int = help_field("boundary of the final hidden state (normally L)")
    norm: NormSide = help_field(
        "'pre': before the target's final norm (engines' convention); 'post': after it"
    )


@dataclass(frozen=True)
class Contract:
    target: TargetIdentity = help_field("identity of the target model")
    aux_boundaries: tuple[int, ...] = help_field(
        "aux states in concat order, as boundary indices (0 = embedding)"
    )
    final: FinalState = help_field("the final hidden state stored/used beside the aux states")
    dtype: str = help_field(f"dtype the target ran in, one of {SUPPORTED_DTYPES}")
    fingerprint: Fingerprint | None = help_field(
        "values of each captured tensor on the probe input", default=None
    )
    schema_version: int = help_field("contract.json schema version", default=SCHEMA_VERSION)

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise ConfigError(f"schema_version: expected {SCHEMA_VERSION}, got {self.schema_version}")
        validate_boundaries(self.aux_boundaries, self.target.num_layers, what="aux_boundaries")
        if not 0 <= self.final.boundary <= self.target.num_layers:
            raise ConfigError(
                f"final.boundary: {self.final.boundary} out of range 0..{self.target.num_layers} (target.num_layers)"
            )
        if self.final.norm == "post" and self.final.boundary != self.target.num_layers:
            raise ConfigError(
                f"final.norm='post' needs final.boundary == target.num_layers ({self.target.num_layers}); "
                f"got final.boundary={self.final.boundary}"
            )
        if self.dtype not in SUPPORTED_DTYPES:
            raise ConfigError(f"dtype: expected one of {SUPPORTED_DTYPES}, got {self.dtype!r}")

    @property
    def num_aux(self) -> int:
        return len(self.aux_boundaries)

    @property
    def aux_width(self) -> int:
        """A*Ht: the width of the concatenated aux states the draft's fc reads."""
        return self.num_aux * self.target.hidden_size

    def describe(self) -> list[str]:
        L = self.target.num_layers
        lines = [
            f"aux[{i}] = boundary {b}: {describe_boundary(b, L)}" for i, b in enumerate(self.aux_boundaries)
        ]
        lines.append(f"final = boundary {self.final.boundary} ({self.final.norm}-norm)")
        return lines

    def without_fingerprint(self) -> Contract:
        return replace(self, fingerprint=None)

    # --- JSON ---
    def to_json(self) -> dict[str, Any]:
        return dict(to_dict(self))

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str = CONTRACT_FILE) -> Contract:
        """Parse a saved contract; one whose aux list (or final state) disagrees with the labels its
        own fingerprint carries is refused, showing both (every command loads contracts here)."""
        contract = from_dict(cls, data, where=where)
        contract.check_fingerprint_labels(where=where)
        return contract

    def check_fingerprint_labels(self, *, where: str = CONTRACT_FILE) -> None:
        """The fingerprint's `aux[i]` entries are labelled with the boundaries they were captured at:
        in order they must be `aux_boundaries`, and its `final` entry must be `final`. A contract
        that says both cannot tell which wiring its tensors have (one of the two was edited)."""
        fp = self.fingerprint
        if fp is None:
            return
        aux = {t.name: t for t in fp.tensors if t.name.startswith("aux[")}
        labels = [aux[f"aux[{i}]"].boundary if f"aux[{i}]" in aux else None for i in range(len(aux))]
        problems = []
        if labels != list(self.aux_boundaries) or any(t.norm != "pre" for t in aux.values()):
            shown = ["?" if b is None else b for b in labels]
            problems.append(
                f"aux_boundaries {list(self.aux_boundaries)} but the fingerprint's tensors aux[0..{len(aux) - 1}] "
                f"are labelled {shown} (their fingerprint.tensors[i].boundary)"
            )
        final = [t for t in fp.tensors if t.name == "final"]
        if final and (final[0].boundary, final[0].norm) != (self.final.boundary, self.final.norm):
            problems.append(
                f"final = boundary {self.final.boundary} {self.final.norm}-norm but the fingerprint's "
                f"'final' is labelled boundary {final[0].boundary} {final[0].norm}-norm"
            )
        if problems:
            raise ContractMismatchError(
                f"{where}: the contract disagrees with its own fingerprint:\n  "
                + "\n  ".join(problems)
                + "\n  the fingerprint's labels were written when the states were captured; one of the two "
                "lists was edited since, so this contract cannot say which states its tensors are",
                fix=f"if aux_boundaries (or final) in {where} was edited by hand, restore it to the fingerprint's "
                "labels; to relabel states whose values are other boundaries (what `eaglewire doctor` reports), "
                "use `eaglewire data relabel` (shards) or `eaglewire draft relabel` (a draft): they prove the new "
                "labels by values on the target and rewrite both",
            )

    def save(self, directory: Path) -> Path:
        path = Path(directory) / CONTRACT_FILE
        atomic_write_json(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: Path) -> Contract:
        path = Path(path)
        if path.is_dir():
            path = path / CONTRACT_FILE
        if not path.exists():
            raise ConfigError(f"{path}: no contract.json (every dataset, checkpoint and export carries one)")
        return cls.from_json(read_json_file(path), where=str(path))


def contract_diff(a: Contract, b: Contract, *, names: tuple[str, str] = ("a", "b")) -> list[str]:
    """Fields that differ (fingerprint numbers and target.name excluded), as 'field: a=.. b=..' lines."""
    out = []
    ta, tb = to_dict(a.target), to_dict(b.target)
    for k in ta:
        if k != "name" and ta[k] != tb[k]:
            out.append(f"target.{k}: {names[0]}={ta[k]} {names[1]}={tb[k]}")
    if a.aux_boundaries != b.aux_boundaries:
        out.append(f"aux_boundaries: {names[0]}={list(a.aux_boundaries)} {names[1]}={list(b.aux_boundaries)}")
    if a.final != b.final:
        out.append(
            f"final: {names[0]}=boundary {a.final.boundary} {a.final.norm}-norm "
            f"{names[1]}=boundary {b.final.boundary} {b.final.norm}-norm"
        )
    return out


def require_same_wiring(
    a: Contract, b: Contract, *, names: tuple[str, str] = ("a", "b"), check_dtype: bool = False
) -> None:
    """Raise ContractMismatchError listing every differing field, printing both sides."""
    diffs = contract_diff(a, b, names=names)
    if check_dtype and a.dtype != b.dtype:
        diffs.append(f"dtype: {names[0]}={a.dtype} {names[1]}={b.dtype}")
    if diffs:
        raise ContractMismatchError(
            f"{names[0]} and {names[1]} disagree on the hidden-state contract:\n  " + "\n  ".join(diffs),
            fix=f"rebuild {names[1]} from the same target and aux boundaries as {names[0]} (or pass the matching one)",
        )
