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
- one-shot outputs (a draft, an export, a dataset) are built in a sibling temporary directory and
  renamed into place, so a failure leaves nothing half-written; an earlier output of the same kind
  is replaced, as a whole, only with `--force`;
- resumable outputs (a training run, a quickstart run, a capture) continue in place under their own
  resume rules;
- a directory of another kind, or one without a marker that holds anything, is never written,
  `--force` or not.

Nothing here imports torch.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglewire.errors import CheckpointError, ConfigError
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
    QUICKSTART_RUN = "quickstart-run"


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


def _describe_contents(directory: Path, limit: int = 6) -> str:
    names = sorted(p.name for p in directory.iterdir())
    shown = ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")
    return shown


def check_output_dir(out: Path, kind: OutputKind, *, force: bool, flag: str = "--out") -> bool:
    """May a one-shot command of `kind` write `out`? Returns True when `out` holds an earlier output
    of the same kind (it will be replaced), False when it is missing or empty. Refuses (ConfigError)
    otherwise. Call it before any work, so a refusal costs nothing."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"{flag} {out}: exists and is a file, not a directory", fix=f"choose another {flag}"
        )
    if not out.exists() or not any(out.iterdir()):
        return False
    marker = read_marker(out)
    if marker is None:
        raise ConfigError(
            f"{flag} {out}: not empty and not an eaglewire output (holds {_describe_contents(out)}); "
            "eaglewire never writes into a directory that holds something else",
            fix=f"choose another {flag} (a new or empty directory)",
        )
    if marker.kind != kind:
        raise ConfigError(
            f"{flag} {out}: holds an eaglewire {marker.kind.value}, not a {kind.value}; "
            "it is never replaced by another kind of output, --force or not",
            fix=f"choose another {flag}",
        )
    if not force:
        raise ConfigError(
            f"{flag} {out}: holds an earlier {kind.value}",
            fix=f"pass --force to replace it as a whole, or choose another {flag}",
        )
    return True


@contextmanager
def fresh_output(out: Path, kind: OutputKind, *, force: bool, flag: str = "--out") -> Iterator[Path]:
    """Build a one-shot output in a sibling temporary directory, yielded to the caller, and put it
    at `out` when the block succeeds (replacing an earlier output of the same kind when `force`).
    On failure nothing at `out` changes. The caller writes the marker into the temporary directory
    (`write_marker`, listing the files whose bytes loading verifies); without one, a bare marker of
    `kind` is written."""
    out = Path(out)
    replace = check_output_dir(out, kind, force=force, flag=flag)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        if read_marker(tmp) is None:
            write_marker(tmp, kind)
        if replace:
            # Two renames: `out` is never half-written; between them only the old copy exists (named old).
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.rename(out, old / out.name)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if out.exists():
                out.rmdir()  # empty (checked above); a rename onto a non-empty directory fails
            os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def claim_output_dir(out: Path, kind: OutputKind, *, flag: str = "--out") -> None:
    """For resumable outputs (training runs, quickstart runs, captures): `out` must be missing, empty,
    or an earlier output of the same kind (which the caller resumes under its own rules). Writes the
    marker when there is none, so the next run recognises the directory."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"{flag} {out}: exists and is a file, not a directory", fix=f"choose another {flag}"
        )
    if out.exists() and any(out.iterdir()):
        marker = read_marker(out)
        if marker is None:
            raise ConfigError(
                f"{flag} {out}: not empty and not an eaglewire output (holds {_describe_contents(out)}); "
                "eaglewire never writes into a directory that holds something else",
                fix=f"choose another {flag} (a new or empty directory)",
            )
        if marker.kind != kind:
            raise ConfigError(
                f"{flag} {out}: holds an eaglewire {marker.kind.value}, not a {kind.value}",
                fix=f"choose another {flag}",
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    write_marker(out, kind)
