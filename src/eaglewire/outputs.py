"""Output directories: which ones a command may write, the marker that says what a directory
holds, and the per-file checksums that prove its files are the ones eaglewire wrote.

Every directory eaglewire writes carries `eaglewire.json`:

    {"format": "eaglewire-output", "version": 1, "kind": "draft",
     "files": {"model.safetensors": {"bytes": 1234, "sha256": "..."}, ...}}

`kind` says which command wrote it; `files` lists the files whose bytes must not change after
(a draft's weights, config and contract; an export's). Loading verifies them, so a copy cut
short or a flipped byte is a named error, not a silently different model.

The rules (README, "Outputs"):
- a command writes only into a missing or empty directory, or into an earlier output of its own
  kind (recognised by the marker);
- one-shot outputs (a draft, an export, a dataset, a vocabulary) are built in a sibling temporary
  directory and renamed into place, so a failure leaves nothing half-written; an earlier output of
  the same kind is replaced, as a whole, only with `--force` (`fresh_output`);
- resumable outputs (a training run, a quickstart run, a capture) continue in place under their own
  resume rules (`check_resumable_dir` before any work, `claim_output_dir` when writing starts);
- a directory of another kind, or one without a marker that holds anything, is never written,
  `--force` or not; nor is a directory inside a one-shot output (a draft, an export...).

Outputs written before markers existed are recognised by their own files (`LEGACY`: a training
run's `train_config.json`, a quickstart run's `preset.json`, a capture's `manifest.json`, a draft's
three files and nothing else...), so an existing run still resumes; its marker is written then.

Nothing here imports torch: the file names below are those the writers use (draft/io.py,
export/exporting.py, data/records.py, data/vocab.py, data/shards.py, train/config.py,
recipes/quickstart.py); tests/unit/test_outputs.py checks that they agree.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglewire.errors import CheckpointError, ConfigError
from eaglewire.io_utils import atomic_write_json, sha256_file

log = logging.getLogger(__name__)

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


# Outputs written once and then only read (or replaced whole): nothing is written inside one.
ONE_SHOT = frozenset(
    {
        OutputKind.DRAFT,
        OutputKind.EXPORT_SGLANG,
        OutputKind.EXPORT_VLLM,
        OutputKind.DATASET,
        OutputKind.VOCAB,
        OutputKind.TRAIN_CHECKPOINT,
    }
)

# What each kind is called in a message.
DESCRIPTION = {
    OutputKind.DRAFT: "an eaglewire draft",
    OutputKind.EXPORT_SGLANG: "an SGLang export",
    OutputKind.EXPORT_VLLM: "a vLLM export",
    OutputKind.DATASET: "a tokenized dataset",
    OutputKind.VOCAB: "a draft vocabulary",
    OutputKind.SHARDS: "a hidden-state shard directory",
    OutputKind.TRAIN_RUN: "a training run",
    OutputKind.TRAIN_CHECKPOINT: "a training checkpoint",
    OutputKind.QUICKSTART_RUN: "a quickstart run",
    OutputKind.BENCH: "a benchmark report",
}
OLD_OUTPUT = " (written before eaglewire.json markers)"


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


# --- the checks ---
def _describe_contents(directory: Path, limit: int = 6) -> str:
    names = sorted(p.name for p in directory.iterdir())
    shown = ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")
    return shown


def _describe(found: Recognised) -> str:
    return DESCRIPTION[found.kind] + ("" if found.marked else OLD_OUTPUT)


def _refuse_inside_output(out: Path, flag: str) -> None:
    """Nothing is written inside a one-shot output (a draft, an export, a dataset...): its files are
    listed and checked as a whole."""
    for parent in Path(os.path.abspath(out)).parents:
        try:
            marker = read_marker(parent)
        except CheckpointError:  # someone else's eaglewire.json: not one of our outputs
            continue
        if marker is not None and marker.kind in ONE_SHOT:
            raise ConfigError(
                f"{flag} {out}: inside {parent}, {_describe(Recognised(marker.kind, True))}; "
                "eaglewire never writes inside another output",
                fix=f"choose another {flag}, outside {parent}",
            )


def _check_path(out: Path, flag: str) -> bool:
    """Common to every output: not a file, not inside a one-shot output. True when `out` holds
    something (a non-empty directory)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"{flag} {out}: exists and is a file, not a directory", fix=f"choose another {flag}"
        )
    _refuse_inside_output(out, flag)
    return out.exists() and any(out.iterdir())


def _refuse_foreign(
    out: Path, kind: OutputKind, found: Recognised | None, flag: str, *, has_force: bool
) -> None:
    if found is None:
        raise ConfigError(
            f"{flag} {out}: not empty and not an eaglewire output (holds {_describe_contents(out)}); "
            "eaglewire never writes into a directory that holds something else",
            fix=f"choose another {flag} (a new or empty directory)",
        )
    if found.kind != kind:
        raise ConfigError(
            f"{flag} {out}: holds {_describe(found)}, not {DESCRIPTION[kind]}; "
            + "it is never replaced by another kind of output"
            + (", --force or not" if has_force else ""),
            fix=f"choose another {flag}",
        )


def check_output_dir(
    out: Path, kind: OutputKind, *, force: bool, flag: str = "--out", force_flag: str = "--force"
) -> bool:
    """May a one-shot command of `kind` write `out`? Returns True when `out` holds an earlier output
    of the same kind (it will be replaced), False when it is missing or empty. Refuses (ConfigError)
    otherwise. Call it before any work, so a refusal costs nothing."""
    out = Path(out)
    if not _check_path(out, flag):
        return False
    found = recognise(out)
    _refuse_foreign(out, kind, found, flag, has_force=True)
    if not force:
        assert found is not None
        raise ConfigError(
            f"{flag} {out}: holds an earlier {DESCRIPTION[kind].split(' ', 1)[1]}"
            + ("" if found.marked else OLD_OUTPUT),
            fix=f"pass {force_flag} to replace it as a whole, or choose another {flag}",
        )
    return True


def check_resumable_dir(out: Path, kind: OutputKind, *, flag: str = "--out") -> Recognised | None:
    """May a resumable command of `kind` write `out`? It must be missing, empty, or an earlier
    output of the same kind (which the caller resumes under its own rules). Writes nothing: call it
    before any work. Returns what was found (None: missing or empty)."""
    out = Path(out)
    if not _check_path(out, flag):
        return None
    found = recognise(out)
    _refuse_foreign(out, kind, found, flag, has_force=False)
    return found


def claim_output_dir(out: Path, kind: OutputKind, *, flag: str = "--out") -> None:
    """For resumable outputs (training runs, quickstart runs, captures): `check_resumable_dir`, then
    create `out` and write its marker when there is none (a run from before markers gets one now),
    so the next run recognises the directory."""
    out = Path(out)
    found = check_resumable_dir(out, kind, flag=flag)
    if found is not None and found.marked:
        return
    if found is not None:
        log.info("%s: %s%s; marked now", out, DESCRIPTION[kind], OLD_OUTPUT)
    out.mkdir(parents=True, exist_ok=True)
    write_marker(out, kind)


def check_output_file(out: Path, *, own: Path, command: str, flag: str = "--out") -> None:
    """For a command that appends to one file and resumes from it (`data regenerate`): `out` may be
    missing, empty, or its own earlier output, recognised by the file it keeps beside it (`own`,
    e.g. the settings sidecar); never a directory, nor a file inside a one-shot output. Writes
    nothing: call it before any work."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"{flag} {out}: is a directory, expected a file", fix=f"choose another {flag}")
    _refuse_inside_output(out, flag)
    if out.exists() and out.stat().st_size > 0 and not Path(own).exists():
        raise ConfigError(
            f"{flag} {out}: exists ({out.stat().st_size} bytes) and is not an earlier output of {command} "
            f"(no {Path(own).name} beside it); eaglewire never writes into a file that holds something else",
            fix=f"choose another {flag} (a new file); a rerun with the same {flag} resumes its own output",
        )


# --- writing a one-shot output whole ---
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE). False when the system
    cannot (another OS, an old kernel or C library, a filesystem without it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def _sibling_dir(out: Path, suffix: str) -> Path:
    """A new directory beside `out` (same filesystem: renames are atomic), with the permissions any
    directory gets here (mkdtemp's are owner-only, which would hide an export from a serving user)."""
    while True:
        path = out.parent / f".{out.name}.{secrets.token_hex(4)}.{suffix}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path


def _put_in_place(tmp: Path, out: Path) -> None:
    """Move the finished directory `tmp` to `out`; an existing `out` is replaced as a whole."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if not any(out.iterdir()):
        out.rmdir()  # a rename onto a non-empty directory fails; onto an empty one it is fine, but be plain
        os.rename(tmp, out)
        return
    if _exchange(tmp, out):  # one step: `out` is the old output, then the new one, never neither
        shutil.rmtree(tmp, ignore_errors=True)  # now the old one
        return
    # Two renames: between them only the old copy exists (moved aside, not deleted).
    old = _sibling_dir(out, "old")
    os.rename(out, old / out.name)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def replacing_dir(out: Path) -> Iterator[Path]:
    """Build a directory in a sibling temporary directory, yielded to the caller, and put it at
    `out` when the block succeeds, replacing whatever was there as a whole. No check: for a
    command's own sub-outputs (a training run's draft/), or after `check_output_dir`. On failure
    nothing at `out` changes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling_dir(out, "tmp")
    try:
        yield tmp
        _put_in_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def fresh_output(
    out: Path, kind: OutputKind, *, force: bool, flag: str = "--out", force_flag: str = "--force"
) -> Iterator[Path]:
    """Build a one-shot output in a sibling temporary directory, yielded to the caller, and put it
    at `out` when the block succeeds (replacing an earlier output of the same kind when `force`).
    On failure nothing at `out` changes. The caller writes the marker into the temporary directory
    (`write_marker`, listing the files whose bytes loading verifies); without one, a bare marker of
    `kind` is written."""
    out = Path(out)
    check_output_dir(out, kind, force=force, flag=flag, force_flag=force_flag)
    with replacing_dir(out) as tmp:
        yield tmp
        marker = read_marker(tmp)
        if marker is None:
            write_marker(tmp, kind)
        elif marker.kind != kind:
            raise CheckpointError(f"{tmp}: built {marker.kind.value}, expected {kind.value} (a bug)")
