"""Validated safetensors reading: every load names the file and the tensor when the file is damaged.

`safetensors` itself refuses a damaged file, but with a `SafetensorError` that names neither the
file nor the tensor ("incomplete metadata, file not fully covered"), and a pickle saved under the
`.safetensors` name reads as a header "too large". Here the header is read and checked first, in
pure Python (the 8-byte length, the JSON, every tensor's dtype, shape and byte range against the
file's size), so a cut-short copy, a pickle, a Git LFS pointer or an edited header is a named error
of the caller's kind (exit 2), before any tensor is read:

    .../model.safetensors: tensor 'layer.mlp.down_proj.weight' (data bytes 81920..147456) lies past
    the end of the file: the file holds 100000 bytes, the header says 147560; the file was cut short

`read_header` costs one small read and a stat (no torch): targets' weight files are checked with it
before transformers opens them. `load_tensors` and `open_tensors` check the header and then read
with safetensors (never pickle); any error safetensors still raises is turned into the same named
error. Hashing is not done here (drafts are verified against their marker's sha256, shards against
their manifest's).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglewire.errors import CheckpointError, EaglewireError

if TYPE_CHECKING:
    import torch

# Bits per element of every dtype the safetensors format names (safetensors 0.8 `Dtype`).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
}
# safetensors refuses headers above 100 MB (`MAX_HEADER_SIZE`); so does this reader.
MAX_HEADER_BYTES = 100_000_000
SAFETENSORS_FIX = (
    "the file is damaged or is not safetensors: copy it again from where it was written, or re-create it"
)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it. `start`/`end`: byte range within the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    file_bytes: int
    header_bytes: int  # the JSON header's length (the 8-byte prefix not included)
    tensors: dict[str, TensorEntry]  # in file order (by start offset)
    metadata: dict[str, str]

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes


def _sniff(head: bytes) -> str:
    """What a file that is not safetensors looks like it is, from its first bytes ('' when unknown)."""
    if head.startswith(b"PK\x03\x04"):
        return " (it starts like a zip archive: a torch.save pickle? eaglewire never unpickles)"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return " (it starts like a Python pickle: eaglewire never unpickles)"
    if head.startswith(b"version https://git-lfs"):
        return " (it is a Git LFS pointer, not the weights: run `git lfs pull`)"
    if head.startswith(b"GGUF"):
        return " (it is a GGUF file: pass the .gguf path as the target instead)"
    if head.lstrip()[:1] in (b"{", b"["):
        return " (it looks like JSON text)"
    return ""


def read_header(
    path: Path, *, error: type[EaglewireError] = CheckpointError, fix: str | None = None
) -> SafetensorsHeader:
    """Read and check `path`'s safetensors header against the file's size; raise `error` naming the
    file (and the tensor, when one is at fault) otherwise, with `fix` (default: copy the file again).
    No torch, no tensor data read."""
    path = Path(path)

    def fail(what: str, default_fix: str = SAFETENSORS_FIX) -> EaglewireError:
        return error(f"{path}: {what}", fix=fix or default_fix)

    # (raised after the `try`: an error class may itself be an OSError, e.g. TargetFilesError)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
            fits = 0 <= n <= min(size - 8, MAX_HEADER_BYTES)
            blob = f.read(n) if fits else prefix + f.read(24)
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except IsADirectoryError:
        raise error(f"{path}: a directory, expected a safetensors file") from None
    except PermissionError as e:
        raise error(f"{path}: cannot be read ({e.strerror})") from None
    if n < 0:
        raise fail(f"{size} bytes, too short for a safetensors file (an 8-byte header length comes first)")
    if not fits:
        raise fail(
            f"not a safetensors file{_sniff(blob)}: its first 8 bytes give a header length of {n} bytes, "
            f"but the file holds {size} bytes"
        )
    try:
        header = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise fail(
            f"the safetensors header ({n} bytes after the 8-byte length) is not valid JSON ({e})"
        ) from None
    if not isinstance(header, dict):
        raise fail(f"the safetensors header is JSON {type(header).__name__}, expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise fail("the header's __metadata__ is not an object of string keys and values")
    entries = [_entry(path, name, info, fail) for name, info in header.items()]
    entries.sort(key=lambda t: (t.start, t.end))
    data_bytes = size - 8 - n
    expected_end = 0
    for prev, t in zip([None, *entries[:-1]], entries, strict=True):
        if t.start != expected_end:
            after = (
                f"the previous tensor {prev.name!r} ends at {expected_end}" if prev else "data starts at 0"
            )
            kind = "overlaps another" if t.start < expected_end else "leaves a gap"
            raise fail(
                f"tensor {t.name!r}: data_offsets start at {t.start}, expected {expected_end} ({after}): it {kind}"
            )
        if t.end > data_bytes:
            raise fail(
                f"tensor {t.name!r} (data bytes {t.start}..{t.end}) lies past the end of the file: the file holds "
                f"{size} bytes, its header says {8 + n + entries[-1].end}; the file was cut short",
                "copy the file again from where it was written (the copy is incomplete), or re-create it",
            )
        expected_end = t.end
    if expected_end != data_bytes:
        raise fail(
            f"{data_bytes - expected_end} bytes after the last tensor's data: the header says "
            f"{8 + n + expected_end} bytes, the file holds {size}"
        )
    return SafetensorsHeader(path, size, n, {t.name: t for t in entries}, dict(metadata))


def _entry(path: Path, name: str, info: Any, fail: Any) -> TensorEntry:
    if not isinstance(info, dict):
        raise fail(f"tensor {name!r}: header entry is {type(info).__name__}, expected an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise fail(
            f"tensor {name!r}: dtype {dtype!r} is not a safetensors dtype (expected one of {sorted(DTYPE_BITS)})"
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise fail(f"tensor {name!r}: shape {shape!r}, expected a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise fail(f"tensor {name!r}: data_offsets {offsets!r}, expected [begin, end] with 0 <= begin <= end")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise fail(
            f"tensor {name!r}: {dtype} {tuple(shape)} needs {bits / 8:g} bytes, its data_offsets {offsets} span "
            f"{offsets[1] - offsets[0]}"
        )
    return TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


def load_tensors(
    path: Path, *, error: type[EaglewireError] = CheckpointError, fix: str | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of `path` on the CPU, after `read_header` checked the file. Never unpickles."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    read_header(path, error=error, fix=fix)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, TypeError) as e:  # changed since the header was read
        raise error(f"{path}: safetensors cannot read it ({e})", fix=fix or SAFETENSORS_FIX) from None


def open_tensors(path: Path, *, error: type[EaglewireError] = CheckpointError, fix: str | None = None) -> Any:
    """`safetensors.safe_open(path, framework="pt")` after `read_header` checked the file (use it in a
    `with` block, or keep it open). Never unpickles."""
    from safetensors import SafetensorError, safe_open

    read_header(path, error=error, fix=fix)
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise error(f"{path}: safetensors cannot read it ({e})", fix=fix or SAFETENSORS_FIX) from None
