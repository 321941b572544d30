"""Output directories: which ones a command may write, and how a one-shot output is put in place whole.
What a directory holds is its marker (`output_marker`: `eaglewire.json`, with the checksums of its files).

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
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eaglewire.errors import CheckpointError, ConfigError
from eaglewire.output_marker import OutputKind, Recognised, read_marker, recognise, write_marker

log = logging.getLogger(__name__)

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
