"""Which kind of data a directory holds, decided in one place from the file each writer leaves.

* captured shards (`eaglewire data capture`, offline training): `MANIFEST_FILE`;
* a tokenized dataset (`eaglewire data build`, online training): `INDEX_FILE` (its loader then names
  a missing `TOKENS_FILE` itself).

Training, evaluation, inspection and the tokenizer lookup all ask here, so they cannot disagree about
a directory that has both or neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from eaglewire.data.records import INDEX_FILE, TOKENS_FILE
from eaglewire.data.shards import MANIFEST_FILE
from eaglewire.errors import DataFormatError

DataDirKind = Literal["shards", "tokens"]


def data_dir_kind(path: Path) -> DataDirKind:
    """The kind of data in `path`: shards or tokens; a directory with neither file is an error naming both."""
    path = Path(path)
    if (path / MANIFEST_FILE).exists():
        return "shards"
    if (path / INDEX_FILE).exists():
        return "tokens"
    raise DataFormatError(
        f"{path}: neither a tokenized dataset ({INDEX_FILE} + {TOKENS_FILE}) nor a shard directory ({MANIFEST_FILE})",
        fix="build one with `eaglewire data build` (online) or `eaglewire data capture` (offline)",
    )
