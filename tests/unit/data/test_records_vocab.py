"""Tokenized dataset on disk and the draft vocabulary's edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglewire.data.records import TokenizedDataset
from eaglewire.data.types import TokenizedRecord
from eaglewire.data.vocab import (
    DRAFT_VOCAB_TENSORS,
    DraftVocab,
    build_draft_vocab,
    load_draft_vocab,
    save_draft_vocab,
    select_draft_vocab,
)
from eaglewire.errors import ConfigError, DataFormatError


def rec(rid: str, ids: list[int], mask: list[int]) -> TokenizedRecord:
    return TokenizedRecord(rid, torch.tensor(ids), torch.tensor(mask, dtype=torch.bool))


def small_dataset() -> TokenizedDataset:
    return TokenizedDataset.from_records(
        [
            rec("a", [1, 7, 7, 9, 2], [0, 1, 1, 1, 1]),
            rec("b", [1, 5, 9, 9, 9, 2], [0, 0, 1, 1, 1, 1]),
            rec("c", [1, 3, 4], [0, 1, 0]),
        ],
        meta={"tokenizer_vocab_size": 16, "special_ids": [0, 1, 2], "split": "train"},
    )


def test_save_load_roundtrip(tmp_path: Path) -> None:
    ds = small_dataset()
    ds.save(tmp_path / "ds")
    back = TokenizedDataset.load(tmp_path / "ds")
    assert len(back) == 3 and back.record_ids == ["a", "b", "c"]
    for i in range(3):
        assert torch.equal(back[i].input_ids, ds[i].input_ids)
        assert torch.equal(back[i].loss_mask, ds[i].loss_mask)
        assert back[i].input_ids.dtype == torch.int64 and back[i].loss_mask.dtype == torch.bool
    assert back.meta["split"] == "train" and back.num_loss_tokens == 9
    assert back[-1].record_id == "c" and back.index_of("b") == 1
    with pytest.raises(IndexError):
        back[3]
    back.save(tmp_path / "again")  # derived counts are recomputed, not copied from the old index
    assert TokenizedDataset.load(tmp_path / "again").num_tokens == 14


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="not a tokenized dataset"):
        TokenizedDataset.load(tmp_path)
    with pytest.raises(DataFormatError, match="offsets"):
        TokenizedDataset(
            ["a"], torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.bool), torch.tensor([0, 2])
        )


def test_vocab_frequency_order_and_specials() -> None:
    ds = small_dataset()
    # loss tokens: 7,7,9,2 | 9,9,9,2 | 3  -> 9:4, 7:2, 2:2, 3:1
    v = build_draft_vocab(ds, 5)
    assert v.draft_to_target.tolist() == [0, 1, 2, 7, 9]  # 3 specials + the two most frequent non-specials
    assert v.stats["filled_unseen"] == 0 and v.stats["picked_by_frequency"] == 2
    assert v.stats["coverage"] == pytest.approx(8 / 9)


def test_vocab_ties_broken_by_ascending_id() -> None:
    counts = torch.tensor([0, 0, 5, 3, 5, 3, 0, 1])
    d2t, stats = select_draft_vocab(counts, 3, special_ids=())
    assert d2t.tolist() == [2, 3, 4]
    assert stats["coverage"] == pytest.approx(13 / 17)


def test_vocab_larger_than_distinct_tokens_is_filled_deterministically() -> None:
    ds = small_dataset()
    v = build_draft_vocab(ds, 10)
    # specials 0,1,2; seen 9,7,3; fill with unseen ascending: 4,5,6,8
    assert v.draft_to_target.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert v.stats["filled_unseen"] == 4 and v.stats["fill_rule"] == "unseen ids in ascending order"
    assert build_draft_vocab(ds, 10).draft_to_target.tolist() == v.draft_to_target.tolist()
    assert build_draft_vocab(ds, 16).draft_to_target.tolist() == list(range(16))


def test_vocab_bounds() -> None:
    ds = small_dataset()
    with pytest.raises(ConfigError, match=r"expected 1\.\.16"):
        build_draft_vocab(ds, 17)
    with pytest.raises(ConfigError, match="smaller than the 3 special tokens"):
        build_draft_vocab(ds, 2)
    with pytest.raises(DataFormatError, match="token id 9 >= vocab size 8"):
        build_draft_vocab(ds, 4, vocab_size=8)


def test_vocab_save_load(tmp_path: Path) -> None:
    v = build_draft_vocab(small_dataset(), 5)
    save_draft_vocab(v, tmp_path)
    back = load_draft_vocab(tmp_path)
    assert back.draft_to_target.tolist() == v.draft_to_target.tolist() and back.stats["draft_vocab_size"] == 5
    with pytest.raises(ConfigError, match="holds an earlier draft vocabulary"):
        save_draft_vocab(DraftVocab(torch.tensor([3, 1]), {}), tmp_path)
    save_draft_vocab(DraftVocab(torch.tensor([3, 1]), {}), tmp_path, force=True)
    with pytest.raises(DataFormatError, match="strictly ascending"):
        load_draft_vocab(tmp_path / DRAFT_VOCAB_TENSORS)
