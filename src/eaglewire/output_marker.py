"""The marker that says what an eaglewire output directory holds, and the per-file checksums that prove
its files are the ones eaglewire wrote. Every directory eaglewire writes carries `eaglewire.json`:

    {"format": "eaglewire-output", "version": 1, "kind": "draft",
     "files": {"model.safetensors": {"bytes": 1234, "sha256": "..."}, ...}}

`kind` says which command wrote it; `files` lists the files whose bytes must not change after
(a draft's weights, config and contract; an export's). Loading verifies them, so a copy cut
short or a flipped byte is a named error, not a silently different model.

Outputs written before markers existed are recognised by their own files (`LEGACY`: a training
run's `train_config.json`, a quickstart run's `preset.json`, a capture's `manifest.json`, a draft's
three files and nothing else...), so an existing run still resumes; its marker is written then.

Nothing here imports torch: the file names below are those the writers use (draft/io.py,
export/exporting.py, data/records.py, data/vocab.py, data/shards.py, train/config.py,
recipes/quickstart.py); tests/unit/test_outputs.py checks that they agree. Which directories a
command may write is `outputs`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglewire.errors import CheckpointError
from eaglewire.io_utils import atomic_write_json, sha256_file

MARKER_FILE = "eaglewire.json"
MARKER_FORMAT = "eaglewire-output"
MARKER_VERSION = 1


class OutputKind(enum.StrEnum):
    """What an eaglewire output directory holds (the marker's `kind`)."""

    DRAFT = "draft"
    EXPORT_SGLANG = "export-sglang"
    EXPORT_VLLM = "export-vllm"
    DATASET = "dataset"
    VOCAB = "vocab"
    SHARDS = "shards"
    TRAIN_RUN = "train-run"
    TRAIN_CHECKPOINT = "train-checkpoint"
    QUICKSTART_RUN = "quickstart-run"
    BENCH = "bench"


@dataclass(frozen=True)
class FileDigest:
    bytes: int
    sha256: str


@dataclass(frozen=True)
class OutputMarker:
    kind: OutputKind
    files: dict[str, FileDigest]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MARKER_FORMAT,
            "version": MARKER_VERSION,
            "kind": self.kind.value,
            "files": {name: {"bytes": d.bytes, "sha256": d.sha256} for name, d in sorted(self.files.items())},
        }


def digest(path: Path) -> FileDigest:
    return FileDigest(bytes=path.stat().st_size, sha256=sha256_file(path))


def write_marker(directory: Path, kind: OutputKind, files: Iterable[str] = ()) -> OutputMarker:
    """Write `directory/eaglewire.json` (atomically) with the size and sha256 of each named file."""
    directory = Path(directory)
    marker = OutputMarker(kind, {name: digest(directory / name) for name in files})
    atomic_write_json(directory / MARKER_FILE, marker.to_json())
    return marker


def read_marker(directory: Path) -> OutputMarker | None:
    """The directory's marker, or None when it has none. A marker that is not ours is an error."""
    path = Path(directory) / MARKER_FILE
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{path}: not valid JSON ({e})", fix="re-create the directory with eaglewire"
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != MARKER_FORMAT:
        raise CheckpointError(
            f"{path}: format: expected {MARKER_FORMAT!r}, got {obj.get('format') if isinstance(obj, dict) else obj!r}"
        )
    try:
        kind = OutputKind(str(obj.get("kind")))
        files = {
            str(name): FileDigest(bytes=int(d["bytes"]), sha256=str(d["sha256"]))
            for name, d in dict(obj.get("files") or {}).items()
        }
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{path}: malformed marker ({e})", fix="re-create the directory with eaglewire"
        ) from None
    return OutputMarker(kind, files)


def verify_files(directory: Path, marker: OutputMarker | None = None) -> None:
    """Check every file the marker lists: present, the recorded size, the recorded sha256.

    Size first (cheap, and a truncated copy is the common case), then the hash."""
    directory = Path(directory)
    marker = marker if marker is not None else read_marker(directory)
    if marker is None:
        return
    for name, want in sorted(marker.files.items()):
        path = directory / name
        if not path.is_file():
            raise CheckpointError(
                f"{path}: listed in {MARKER_FILE} but missing",
                fix=f"copy the whole directory {directory} again, or re-create it",
            )
        size = path.stat().st_size
        if size != want.bytes:
            raise CheckpointError(
                f"{path}: size: expected {want.bytes} bytes (as written, per {MARKER_FILE}), got {size}",
                fix=f"the file was cut short or replaced; copy the whole directory {directory} again",
            )
        got = sha256_file(path)
        if got != want.sha256:
            raise CheckpointError(
                f"{path}: sha256: expected {want.sha256[:16]}... (as written, per {MARKER_FILE}), got {got[:16]}...: "
                "the bytes changed after eaglewire wrote them",
                fix=f"copy the whole directory {directory} again, or re-create it",
            )


# --- outputs written before markers existed ---
def _json_field(name: str, key: str, values: tuple[str, ...]) -> Callable[[Path], bool]:
    """A probe: `directory/name` is a JSON object whose `key` is one of `values`."""

    def probe(directory: Path) -> bool:
        try:
            obj = json.loads((directory / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(obj, dict) and obj.get(key) in values

    return probe


def _any_file(*names: str) -> Callable[[Path], bool]:
    """A probe: the directory holds at least one of `names`."""
    return lambda directory: any((directory / n).is_file() for n in names)


@dataclass(frozen=True)
class Legacy:
    """How an output of one kind written before markers existed looks: the files it must hold,
    the only other files it may hold (None: anything, as a run directory), and an optional probe
    of a file's contents."""

    required: frozenset[str]
    allowed: frozenset[str] | None = frozenset()
    probe: Callable[[Path], bool] | None = None

    def matches(self, directory: Path, names: set[str]) -> bool:
        if not self.required <= names:
            return False
        if self.allowed is not None and not names <= self.required | self.allowed:
            return False
        return self.probe is None or self.probe(directory)


_DRAFT_FILES = frozenset({"config.json", "model.safetensors", "contract.json"})
_EXPORT_FILES = _DRAFT_FILES | {"export.json"}
_VOCAB_FILES = frozenset({"draft_vocab.safetensors", "draft_vocab.json"})
_CHECKPOINT_FILES = _DRAFT_FILES | {
    "optimizer.safetensors",
    "optimizer.json",
    "rng.safetensors",
    "trainer_state.json",
}
# Checked in this order: the first that matches names the kind.
LEGACY: dict[OutputKind, Legacy] = {
    OutputKind.EXPORT_SGLANG: Legacy(
        _EXPORT_FILES | {"launch_sglang.sh"}, probe=_json_field("export.json", "format", ("sglang",))
    ),
    OutputKind.EXPORT_VLLM: Legacy(
        _EXPORT_FILES | {"launch_vllm.sh"}, probe=_json_field("export.json", "format", ("vllm",))
    ),
    OutputKind.TRAIN_CHECKPOINT: Legacy(_CHECKPOINT_FILES),
    # best_setting.json: `eaglewire bench --sweep` writes it beside the draft
    OutputKind.DRAFT: Legacy(_DRAFT_FILES, frozenset({"best_setting.json"})),
    OutputKind.DATASET: Legacy(frozenset({"tokens.safetensors", "index.json"}), _VOCAB_FILES),
    OutputKind.VOCAB: Legacy(_VOCAB_FILES),
    OutputKind.SHARDS: Legacy(
        frozenset({"manifest.json"}),
        None,
        _json_field("manifest.json", "format", ("eaglewire-hidden-state-shards",)),
    ),
    OutputKind.TRAIN_RUN: Legacy(frozenset({"train_config.json"}), None),
    OutputKind.QUICKSTART_RUN: Legacy(frozenset({"preset.json"}), None),
    # a bench writes bench.json, a sweep sweep.json (and sweep.partial.json while it runs)
    OutputKind.BENCH: Legacy(frozenset(), None, _any_file("bench.json", "sweep.json", "sweep.partial.json")),
}


@dataclass(frozen=True)
class Recognised:
    kind: OutputKind
    marked: bool  # False: recognised by its files (written before markers existed)


def recognise(directory: Path) -> Recognised | None:
    """What eaglewire output `directory` holds: by its marker, else by the files an output of each
    kind held before markers existed; None when it is neither (or missing)."""
    directory = Path(directory)
    marker = read_marker(directory)
    if marker is not None:
        return Recognised(marker.kind, True)
    if not directory.is_dir():
        return None
    names = {p.name for p in directory.iterdir()}
    for kind, legacy in LEGACY.items():
        if legacy.matches(directory, names):
            return Recognised(kind, False)
    return None


def update_marker(directory: Path, kind: OutputKind, files: Iterable[str]) -> OutputMarker:
    """Add (or refresh) `files` in the marker of `directory`, an output of `kind` (a vocabulary
    written beside its dataset). One from before markers gets a marker now, listing the files its
    kind holds as well."""
    directory = Path(directory)
    marker = read_marker(directory)
    if marker is not None and marker.kind != kind:
        raise CheckpointError(f"{directory / MARKER_FILE}: kind {marker.kind.value}, expected {kind.value}")
    listed = (
        dict(marker.files)
        if marker is not None
        else {name: digest(directory / name) for name in sorted(LEGACY[kind].required)}
    )
    listed.update({name: digest(directory / name) for name in files})
    updated = OutputMarker(kind, listed)
    atomic_write_json(directory / MARKER_FILE, updated.to_json())
    return updated
