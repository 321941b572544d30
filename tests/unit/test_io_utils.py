"""atomic_path: the rename happens only on success, nothing is left beside the file, and the
temporary file does not exist before the block writes it (so writing it never truncates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglewire.io_utils import atomic_path, atomic_write_json
from eaglewire.typed_config import read_json_file


def test_atomic_path_yields_a_fresh_path_and_renames_on_success(tmp_path: Path) -> None:
    target = tmp_path / "out" / "shard-00000.safetensors"
    with atomic_path(target) as tmp:
        assert not tmp.exists()  # the block creates it: no truncation of an existing file
        assert not target.exists()
        assert tmp.parent.parent == target.parent  # same filesystem: the rename is atomic
        tmp.write_bytes(b"payload")
    assert target.read_bytes() == b"payload"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


def test_atomic_path_keeps_the_old_file_and_leaves_nothing_when_the_block_fails(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    atomic_write_json(target, {"version": 1})
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_text("half a file")
        raise RuntimeError("disk full")
    assert read_json_file(target) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_atomic_path_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
