"""Write a safetensors file in one streaming pass, hashing the bytes as they are written.

`safetensors.torch.save_file` wants one tensor per name (so a shard's records must first be
concatenated: a full copy), serialises the whole file into a bytes buffer (a second copy) and
only then writes it; hashing the result means reading the file back (a third pass). Here each
name maps to a list of parts that are concatenated along dim 0 *in the file*: the header is
computed from the parts' shapes, then every part's bytes go straight from its memory (a
zero-copy `uint8` view, any dtype including bfloat16) into an incremental sha256 and the file.
`hashlib` and file writes release the GIL for large buffers, so several writer threads scale.

Each call that releases the GIL must take it back, and while a capture runs, the thread launching
the target's kernels holds it almost all the time, so each handoff can cost that thread a wait
(on an H200 its forwards took 2.4-2.6 s with the writers beside them, 2.14 s without). So a
part is hashed in one call, not in chunks, and all parts of all tensors go to the file in one
`os.writev` (up to IOV_MAX buffers): with capture's packed shards (one part per tensor) a shard
is about six hash calls and one write. (Writing the file on a helper thread beside the hash was
measured on an H200 together with capture's handoff thread: the last writes took 0.23-0.34 s
against 0.20 s without, and the two changes were not separated; the simpler order stays.)

The file is plain safetensors (8-byte little-endian header length, a JSON header padded with
spaces so the data starts 8-byte aligned, then the tensors' little-endian bytes back to back in
header order): `safetensors.torch.load_file` / `safe_open` read it. Writing is not atomic by
itself: wrap it in `eaglewire.io_utils.atomic_path`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from eaglewire.errors import DataFormatError

# Buffers per os.writev call at most (POSIX IOV_MAX; Linux: 1024).
IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def _check_parts(path: Path, name: str, parts: Sequence[torch.Tensor]) -> tuple[torch.dtype, list[int]]:
    """The dtype and the shape of `torch.cat(parts)`; raises naming the tensor and both shapes when
    the parts cannot be concatenated along dim 0 without conversion."""
    if not parts:
        raise DataFormatError(f"{path}: tensor {name!r}: no parts (its shape would be unknown)")
    first = parts[0]
    for k, p in enumerate(parts):
        if p.dim() < 1:
            raise DataFormatError(
                f"{path}: tensor {name!r} part {k}: expected at least 1 dim (parts join along dim 0), "
                f"got shape {tuple(p.shape)}"
            )
        if p.device.type != "cpu":
            raise DataFormatError(f"{path}: tensor {name!r} part {k}: expected a CPU tensor, got {p.device}")
        if p.dtype != first.dtype:
            raise DataFormatError(
                f"{path}: tensor {name!r} part {k}: dtype {p.dtype} differs from part 0's {first.dtype}"
            )
        if p.shape[1:] != first.shape[1:]:
            raise DataFormatError(
                f"{path}: tensor {name!r} part {k}: shape {tuple(p.shape)} cannot follow part 0's "
                f"{tuple(first.shape)} along dim 0 (trailing dims {tuple(first.shape[1:])} expected, "
                f"got {tuple(p.shape[1:])})"
            )
    if first.dtype not in SAFETENSORS_DTYPES:
        raise DataFormatError(
            f"{path}: tensor {name!r}: dtype {first.dtype} has no safetensors name here; expected one of "
            f"{sorted(str(d) for d in SAFETENSORS_DTYPES)}"
        )
    return first.dtype, [sum(int(p.shape[0]) for p in parts), *(int(d) for d in first.shape[1:])]


def _byte_view(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (a copy only when `t` is not contiguous). [numel*itemsize] u8"""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data


def write_all(fd: int, views: Sequence[memoryview], iov_max: int = IOV_MAX) -> None:
    """Write `views` back to back to `fd`, up to `iov_max` buffers per system call, continuing after
    short writes (one write moves at most ~2 GiB on Linux)."""
    pending = [v.cast("B") for v in views if v.nbytes]
    while pending:
        if hasattr(os, "writev"):
            written = os.writev(fd, pending[:iov_max])
        else:  # not POSIX
            written = os.write(fd, pending[0])
        while pending and written >= pending[0].nbytes:  # drop the buffers written whole
            written -= pending[0].nbytes
            pending.pop(0)
        if written:  # a short write ended inside this buffer
            pending[0] = pending[0][written:]


def write_safetensors_stream(
    path: Path,
    tensors: Mapping[str, Sequence[torch.Tensor]],
    metadata: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Write `{name: torch.cat(parts)}` to `path` as safetensors without concatenating; return the
    file's (size in bytes, sha256 hex of its bytes).

    `tensors`: per name, the parts in order, each `[n_k, *rest]` with the same `rest` and dtype
    (CPU tensors); the stored tensor is `[sum(n_k), *rest]`. Names are stored in mapping order.
    `metadata`: string keys and values, the safetensors `__metadata__`.
    """
    path = Path(path)
    if sys.byteorder != "little":
        raise DataFormatError(f"{path}: safetensors is little-endian; this host is {sys.byteorder}-endian")
    header: dict[str, object] = {}
    if metadata:
        bad = {
            k: type(v).__name__
            for k, v in metadata.items()
            if not isinstance(k, str) or not isinstance(v, str)
        }
        if bad:
            raise DataFormatError(f"{path}: __metadata__: expected str keys and values, got {bad}")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, parts in tensors.items():
        if name == "__metadata__":
            raise DataFormatError(f"{path}: '__metadata__' is reserved in safetensors, not a tensor name")
        dtype, shape = _check_parts(path, name, parts)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": shape,
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-(8 + len(blob)) % 8)  # the data starts 8-byte aligned
    prefix = struct.pack("<Q", len(blob)) + blob
    digest = hashlib.sha256(prefix)
    views = [memoryview(prefix)]
    for parts in tensors.values():
        views.extend(_byte_view(part) for part in parts if part.numel() > 0)
    for view in views[1:]:
        digest.update(view)
    with open(path, "wb", buffering=0) as f:  # unbuffered: every buffer goes straight to the kernel
        write_all(f.fileno(), views)
        size = f.tell()
    if size != len(prefix) + offset:
        raise DataFormatError(
            f"{path}: wrote {size} bytes, expected {len(prefix) + offset} (header {len(prefix)} + data {offset})"
        )
    return size, digest.hexdigest()
