"""data.kind: one answer to "which kind of data is this directory" for training, eval and inspection."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglewire.data.inspect import inspect_record, recorded_tokenizer_path
from eaglewire.data.kind import data_dir_kind
from eaglewire.data.records import INDEX_FILE, TOKENS_FILE
from eaglewire.data.shards import MANIFEST_FILE
from eaglewire.errors import DataFormatError
from eaglewire.train.run import open_data


def test_the_file_each_writer_leaves_decides(tmp_path: Path) -> None:
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / INDEX_FILE).write_text("{}")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / MANIFEST_FILE).write_text("{}")
    assert data_dir_kind(tmp_path / "tokens") == "tokens"
    assert data_dir_kind(tmp_path / "shards") == "shards"


def test_neither_is_named_with_the_fix_everywhere(tmp_path: Path) -> None:
    expected = rf"neither a tokenized dataset \({INDEX_FILE} \+ {TOKENS_FILE}\) nor a shard directory \({MANIFEST_FILE}\)"
    for call in (data_dir_kind, open_data, inspect_record):
        with pytest.raises(DataFormatError, match=expected) as e:
            call(tmp_path)
        assert e.value.fix is not None and "eaglewire data build" in e.value.fix
    assert recorded_tokenizer_path(tmp_path) is None  # the lookup stays quiet; inspect_record says why


def test_a_dataset_missing_its_tokens_names_that_file(tmp_path: Path) -> None:
    (tmp_path / INDEX_FILE).write_text("{}")
    for call in (open_data, inspect_record):
        with pytest.raises(DataFormatError, match=rf"not a tokenized dataset \({TOKENS_FILE} missing\)"):
            call(tmp_path)
