"""Write a safetensors file in one streaming pass, hashing the bytes as they are written.

`safetensors.torch.save_file` wants one tensor per name (so a shard's records must first be
concatenated: a full copy), serialises the whole file into a bytes buffer (a second copy) and
only then writes it; hashing the result means reading the file back (a third pass). Here each
name maps to a list of parts that are concatenated along dim 0 *in the file*: the header is
computed from the parts' shapes, then every part's bytes go straight from its memory (a
zero-copy `uint8` view, any dtype including bfloat16) into an incremental sha256 and the file.
`hashlib` and file writes release the GIL for large buffers, so several writer threads scale.

The file is plain safetensors (8-byte little-endian header length, a JSON header padded with
spaces so the data starts 8-byte aligned, then the tensors' little-endian bytes back to back in
header order): `safetensors.torch.load_file` / `safe_open` read it. Writing is not atomic by
itself: wrap it in `eaglewire.io_utils.atomic_path`.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from eaglewire.errors import DataFormatError

# Bytes hashed and written per step: small enough to still be in cache when the write copies
# it into the page cache after sha256 read it, large enough that both calls release the GIL.
STREAM_CHUNK_BYTES = 1 << 20

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
    with open(path, "wb") as f:
        f.write(prefix)
        for parts in tensors.values():
            for part in parts:
                if part.numel() == 0:
                    continue
                data = _byte_view(part)
                for lo in range(0, len(data), STREAM_CHUNK_BYTES):
                    chunk = data[lo : lo + STREAM_CHUNK_BYTES]
                    digest.update(chunk)
                    f.write(chunk)
        size = f.tell()
    if size != len(prefix) + offset:
        raise DataFormatError(
            f"{path}: wrote {size} bytes, expected {len(prefix) + offset} (header {len(prefix)} + data {offset})"
        )
    return size, digest.hexdigest()
