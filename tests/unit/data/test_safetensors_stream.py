"""The streaming safetensors writer: files equal what torch.cat + save_file would hold."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eaglewire.data import safetensors_stream
from eaglewire.data.safetensors_stream import write_all, write_safetensors_stream
from eaglewire.errors import DataFormatError


def parts_of(dtype: torch.dtype, sizes: list[int], rest: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        if dtype == torch.bool:
            out.append(torch.rand((n, *rest), generator=g) > 0.5)
        elif dtype == torch.int64:
            out.append(torch.randint(-(2**40), 2**40, (n, *rest), generator=g, dtype=torch.int64))
        else:
            out.append(torch.randn((n, *rest), generator=g).to(dtype))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("rest", [(), (5,)], ids=["1d", "2d"])
def test_roundtrip_equals_cat(tmp_path: Path, dtype: torch.dtype, rest: tuple[int, ...]) -> None:
    tensors = {
        "a": parts_of(dtype, [3, 0, 7, 1], rest, seed=0),  # an empty part in the middle
        "b": parts_of(dtype, [0], rest, seed=1),  # only empty: a [0, ...] tensor
        "c": parts_of(torch.int64, [4], (), seed=2),  # another dtype after it
        "d": parts_of(dtype, [2, 0], rest, seed=3),  # an empty part at the end
    }
    metadata = {"record_ids": json.dumps(["x", "y"]), "format": "test"}
    path = tmp_path / "t.safetensors"
    size, digest = write_safetensors_stream(path, tensors, metadata)
    raw = path.read_bytes()
    assert size == len(raw) and digest == hashlib.sha256(raw).hexdigest()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0  # data 8-byte aligned
    loaded = load_file(str(path))
    assert set(loaded) == set(tensors)
    for name, parts in tensors.items():
        expect = torch.cat(parts)
        got = loaded[name]
        assert got.dtype == expect.dtype and got.shape == expect.shape, name
        assert torch.equal(got, expect), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == metadata
        assert torch.equal(f.get_slice("a")[2:9], torch.cat(tensors["a"])[2:9])


def test_non_contiguous_and_large_parts(tmp_path: Path) -> None:
    """Parts that are strided views, and parts of several MiB (each hashed and written whole)."""
    big = torch.randn((3 << 20) // 4 + 37, 3)  # [n, 3] f32: ~9 MiB
    strided = big.t().contiguous().t()  # same values, column-major
    parts = [big[:, 1:], big[:, :2].contiguous(), strided[:5, :2], torch.randn(4, 6)[:, ::3]]
    assert not parts[0].is_contiguous() and not parts[2].is_contiguous() and not parts[3].is_contiguous()
    path = tmp_path / "t.safetensors"
    size, digest = write_safetensors_stream(path, {"x": parts})
    assert torch.equal(load_file(str(path))["x"], torch.cat(parts))
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest() and size == path.stat().st_size


def test_write_all_continues_after_short_writes_and_groups_by_iov_max(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A writev that moves only part of its buffers (as one past ~2 GiB does on Linux) is continued
    where it stopped, inside a buffer or between two; at most iov_max buffers go per call."""
    real = os.writev
    calls: list[int] = []

    def short_writev(fd: int, buffers: list[memoryview]) -> int:
        calls.append(len(buffers))
        return real(fd, [b"".join(bytes(b) for b in buffers)[:7]])  # at most 7 bytes a call

    monkeypatch.setattr(safetensors_stream.os, "writev", short_writev)
    chunks = [bytes(range(i, i + n)) for i, n in enumerate([5, 0, 9, 1, 16, 3])]
    path = tmp_path / "w.bin"
    with open(path, "wb", buffering=0) as f:
        write_all(f.fileno(), [memoryview(c) for c in chunks], iov_max=2)
    assert path.read_bytes() == b"".join(chunks)
    assert max(calls) <= 2 and len(calls) == -(-sum(map(len, chunks)) // 7)


def test_no_metadata(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    write_safetensors_stream(path, {"x": [torch.arange(5)]})
    with safe_open(str(path), framework="pt") as f:
        assert not f.metadata()
        assert torch.equal(f.get_tensor("x"), torch.arange(5))


def test_same_bytes_as_shard_reader_expects(tmp_path: Path) -> None:
    """A file with the same tensors as save_file loads to the same tensors and metadata."""
    from safetensors.torch import save_file

    parts = parts_of(torch.bfloat16, [2, 3], (4,), seed=5)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    write_safetensors_stream(ours, {"aux": parts, "ids": [torch.arange(5)]}, {"k": "v"})
    save_file({"aux": torch.cat(parts), "ids": torch.arange(5)}, str(theirs), metadata={"k": "v"})
    a, b = load_file(str(ours)), load_file(str(theirs))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_trailing_dims_mismatch_names_tensor_and_shapes(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    with pytest.raises(DataFormatError) as e:
        write_safetensors_stream(path, {"aux": [torch.zeros(3, 8), torch.zeros(2, 6)]})
    msg = str(e.value)
    assert "'aux'" in msg and "(2, 6)" in msg and "(3, 8)" in msg and str(path) in msg
    assert not path.exists()  # nothing written before the header was known to be valid


def test_other_bad_inputs(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    with pytest.raises(
        DataFormatError, match=r"'x' part 1: dtype torch.float32 differs from part 0's torch.bfloat16"
    ):
        write_safetensors_stream(path, {"x": [torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2)]})
    with pytest.raises(DataFormatError, match="'x' part 0: expected at least 1 dim"):
        write_safetensors_stream(path, {"x": [torch.tensor(1.0)]})
    with pytest.raises(DataFormatError, match="'x': no parts"):
        write_safetensors_stream(path, {"x": []})
    with pytest.raises(DataFormatError, match="__metadata__"):
        write_safetensors_stream(path, {"x": [torch.zeros(1)]}, {"k": 1})  # type: ignore[dict-item]
    with pytest.raises(DataFormatError, match="complex"):
        write_safetensors_stream(path, {"x": [torch.zeros(1, dtype=torch.complex64)]})


def test_write_shard_streams_record_views(tmp_path: Path) -> None:
    """write_shard over records that are views into batch buffers (as capture makes them): the shard
    holds torch.cat of each field, int64 ids and bool mask, and its ShardInfo hashes the file."""
    from eaglewire.data.shards import write_shard
    from eaglewire.data.types import CapturedRecord, ShardContent

    lengths = [5, 0, 3]
    aux = torch.randn(len(lengths), 6, 8).to(torch.bfloat16)  # [B, T, A*Ht] batch buffer
    final = torch.randn(len(lengths), 6, 4).to(torch.bfloat16)  # [B, T, Ht]
    records = [
        CapturedRecord(
            f"r{i}",
            torch.arange(T, dtype=torch.int32),
            torch.arange(T) % 2 == 0,
            aux[i, :T],
            final[i, :T],
        )
        for i, T in enumerate(lengths)
    ]
    path = tmp_path / "shard.safetensors"
    info = write_shard(path, 0, 0, ShardContent.from_records(records))
    assert info.bytes == path.stat().st_size and info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.tokens == 8 and info.loss_tokens == 3 + 2
    got = load_file(str(path))
    assert got["input_ids"].dtype == torch.int64 and got["loss_mask"].dtype == torch.bool
    assert torch.equal(got["input_ids"], torch.cat([r.input_ids for r in records]).long())
    assert torch.equal(got["aux"], torch.cat([r.aux for r in records]))
    assert torch.equal(got["final"], torch.cat([r.final for r in records]))
    assert got["offsets"].tolist() == [0, 5, 5, 8]
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["record_ids"]) == ["r0", "r1", "r2"]

    records[2] = CapturedRecord(
        "r2", records[2].input_ids, records[2].loss_mask, records[2].aux.float(), records[2].final
    )
    with pytest.raises(
        DataFormatError, match=r"record r2: aux \(3, 8\) torch.float32 does not match record r0"
    ):
        write_shard(tmp_path / "bad.safetensors", 0, 0, ShardContent.from_records(records))
    assert not (tmp_path / "bad.safetensors").exists()


def test_write_shard_names_a_tensor_whose_rows_do_not_add_up(tmp_path: Path) -> None:
    """A packed shard whose aux holds fewer rows than the records' lengths add up to is refused,
    naming the tensor and both counts, and leaves no file."""
    from eaglewire.data.shards import write_shard
    from eaglewire.data.types import ShardContent

    content = ShardContent(
        record_ids=["a", "b"],
        lengths=[3, 2],
        input_ids=[torch.arange(5)],
        loss_mask=[torch.ones(5, dtype=torch.bool)],
        aux=[torch.zeros(4, 6)],
        final=[torch.zeros(5, 2)],
    )
    path = tmp_path / "short.safetensors"
    with pytest.raises(DataFormatError, match=r"tensor 'aux' has 4 rows, expected 5"):
        write_shard(path, 0, 0, content)
    assert not path.exists()
    int32 = ShardContent(**{**content.__dict__, "input_ids": [torch.arange(5, dtype=torch.int32)]})
    with pytest.raises(
        DataFormatError, match=r"tensor 'input_ids': expected torch.int64, got parts of \['torch.int32'\]"
    ):
        write_shard(path, 0, 0, int32)
    ok = ShardContent(**{**content.__dict__, "aux": [torch.arange(30.0).view(5, 6)]})
    info = write_shard(path, 0, 0, ok)
    got = load_file(str(path))
    assert info.tokens == 5 and got["offsets"].tolist() == [0, 3, 5]
    assert [r.aux.tolist() for r in ok.records()] == [got["aux"][:3].tolist(), got["aux"][3:].tolist()]
