"""Offset d2t / boolean t2d <-> absolute draft_to_target, and every way the engines' form can be wrong."""

from __future__ import annotations

import pytest
import torch

from eaglewire.errors import CheckpointError
from eaglewire.export.vocab_map import absolute_to_offsets, is_identity, offsets_to_absolute

V = 50


def test_round_trip_and_engine_rule() -> None:
    absolute = torch.tensor([0, 3, 4, 10, 49])
    d2t, t2d = absolute_to_offsets(absolute, V)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert torch.equal(torch.arange(5) + d2t, absolute)  # target = draft + d2t[draft]
    assert int(t2d.sum()) == 5 and bool(t2d[absolute].all())
    assert torch.equal(offsets_to_absolute(d2t, t2d, vocab_size=V, draft_vocab_size=5), absolute)


def test_identity() -> None:
    assert is_identity(torch.arange(V), V)
    assert not is_identity(torch.arange(V - 1), V)
    assert torch.equal(offsets_to_absolute(None, None, vocab_size=V, draft_vocab_size=V), torch.arange(V))


def test_all_zero_d2t_with_smaller_draft_vocab_is_refused() -> None:
    with pytest.raises(CheckpointError, match="'d2t' is all zeros.*draft_vocab_size=5 < vocab_size=50"):
        offsets_to_absolute(torch.zeros(5, dtype=torch.long), None, vocab_size=V, draft_vocab_size=5)
    t2d = torch.zeros(V, dtype=torch.bool)
    with pytest.raises(CheckpointError, match="all zeros"):
        offsets_to_absolute(torch.zeros(5, dtype=torch.long), t2d, vocab_size=V, draft_vocab_size=5)
    # ... unless t2d confirms that the draft vocabulary really is the first Vd ids
    t2d[:5] = True
    assert torch.equal(
        offsets_to_absolute(torch.zeros(5, dtype=torch.long), t2d, vocab_size=V, draft_vocab_size=5),
        torch.arange(5),
    )


def test_missing_d2t_with_smaller_draft_vocab() -> None:
    with pytest.raises(CheckpointError, match="'d2t' missing while draft_vocab_size=5 < vocab_size=50"):
        offsets_to_absolute(None, None, vocab_size=V, draft_vocab_size=5)


def test_t2d_count_and_consistency() -> None:
    d2t, t2d = absolute_to_offsets(torch.tensor([1, 2, 7]), V)
    extra = t2d.clone()
    extra[30] = True
    with pytest.raises(CheckpointError, match="'t2d' marks 4 target ids, expected 3"):
        offsets_to_absolute(d2t, extra, vocab_size=V, draft_vocab_size=3)
    moved = t2d.clone()
    moved[7], moved[8] = False, True
    with pytest.raises(CheckpointError, match="disagree.*first: \\[7\\]"):
        offsets_to_absolute(d2t, moved, vocab_size=V, draft_vocab_size=3)
    with pytest.raises(CheckpointError, match="'t2d': expected shape \\(50,\\)"):
        offsets_to_absolute(d2t, t2d[:40], vocab_size=V, draft_vocab_size=3)


def test_offsets_out_of_range_and_duplicates() -> None:
    with pytest.raises(CheckpointError, match="0..49.*got 1..55.*offsets"):
        offsets_to_absolute(torch.tensor([1, 1, 53]), None, vocab_size=V, draft_vocab_size=3)
    with pytest.raises(CheckpointError, match="appear twice"):
        offsets_to_absolute(torch.tensor([1, 0, 0]), None, vocab_size=V, draft_vocab_size=3)  # 1, 1, 2
    with pytest.raises(CheckpointError, match="'d2t': expected shape \\(4,\\).*got \\(3,\\)"):
        offsets_to_absolute(torch.tensor([1, 1, 1]), None, vocab_size=V, draft_vocab_size=4)
    with pytest.raises(CheckpointError, match="integer dtype"):
        offsets_to_absolute(torch.zeros(3), None, vocab_size=V, draft_vocab_size=3)
    with pytest.raises(CheckpointError, match="0..49"):
        absolute_to_offsets(torch.tensor([0, 50]), V)
