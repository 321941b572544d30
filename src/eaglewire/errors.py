"""One exception hierarchy for eaglewire.

Every message names the thing that is wrong (file, line, field, tensor), what was expected
and what was found, and, where there is one, the fix. The CLI maps `EaglewireError` to exit
code 2 ("the input itself is invalid") and prints the message without a traceback.
"""

from __future__ import annotations


class EaglewireError(Exception):
    """Base class. `fix` is the one change that resolves the problem, when known."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.fix = fix
        super().__init__(message if fix is None else f"{message}\n  fix: {fix}")


class ConfigError(EaglewireError, ValueError):
    """A config value (dataclass field, JSON key, CLI flag) is missing, unknown or inconsistent."""


class BoundaryError(ConfigError):
    """A layer id or boundary index is out of range, duplicated, or ambiguous between numberings."""


class UnsupportedArchitectureError(EaglewireError, ValueError):
    """The target's architecture is not one eaglewire knows how to capture from."""


class TargetFilesError(EaglewireError, FileNotFoundError):
    """A target directory or file is missing something it needs, or its hash is wrong."""


class ContractMismatchError(EaglewireError):
    """Two stages disagree about the hidden-state contract (target, boundaries, norm, dtype)."""


class FingerprintMismatchError(ContractMismatchError):
    """Recomputed hidden states do not match a contract's fingerprint by values."""


class DataFormatError(EaglewireError, ValueError):
    """A data file is malformed: names the file and line (or shard and tensor)."""


class CheckpointError(EaglewireError):
    """A checkpoint or export is missing a tensor or key, or has the wrong shape."""


class ServerError(EaglewireError):
    """An HTTP server eaglewire talks to (`data regenerate --server`, `doctor --served`) cannot be
    reached, or answered in a shape an OpenAI-compatible server or the named engine does not have."""


def expected_actual(what: str, expected: object, actual: object) -> str:
    """Uniform 'X: expected A, got B' phrasing used across the package."""
    return f"{what}: expected {expected}, got {actual}"


class TrainingError(EaglewireError):
    """Training cannot continue: a non-finite loss or gradient (names the step and records), a resume mismatch."""
