"""Atomic file writes, hashing and the cache directory. Nothing here imports torch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HASH_CHUNK_BYTES = 1 << 20


def eaglewire_home() -> Path:
    """Where converted targets and other caches live: `$EAGLEWIRE_HOME`, else the user cache dir.

    Never the working directory.
    """
    env = os.environ.get("EAGLEWIRE_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eaglewire"


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (no file there yet); rename it into place only if the
    block succeeds.

    The temporary file sits alone in a fresh private directory beside `path` (same filesystem, so
    the rename is atomic) and the block creates it. Why not `mkstemp`: its file exists already, so
    the block's `open(tmp, "wb")` truncates it, and on ext4 a truncation to size 0 sets
    auto_da_alloc's flag, which makes close() flush the whole file to disk in the writing thread
    (measured: ~0.25 s per GB of capture shards, a third of their write time)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp = tmp_dir / path.name
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)  # empty after the rename; else the failed block's file


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a canonical JSON rendering (sorted keys, no whitespace)."""
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
