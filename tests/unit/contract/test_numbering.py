"""One test per row of DESIGN.md's numbering table, plus round trips and the ambiguous cases."""

import pytest

from eaglewire.contract.numbering import (
    Numbering,
    default_boundaries,
    describe_boundary,
    from_boundaries,
    read_sglang_both,
    sglang_ids_unambiguous,
    to_boundaries,
)
from eaglewire.errors import BoundaryError

L = 61  # the field reports' Kimi-K2.5 / DeepSeek-V3 depth


def test_defaults_are_2_half_minus3():
    assert default_boundaries(L) == (2, 30, 58)
    assert default_boundaries(30) == (2, 15, 27)


@pytest.mark.parametrize("num_layers", [1, 2, 4, 5, 6])
def test_too_shallow_for_three_distinct_defaults(num_layers):
    with pytest.raises(BoundaryError, match="too shallow"):
        default_boundaries(num_layers)


def test_vllm_and_speculators_ids_are_boundaries():
    assert to_boundaries([3, 31, 59], Numbering.VLLM, L) == (3, 31, 59)
    assert to_boundaries([3, 31, 59], Numbering.SPECULATORS, L) == (3, 31, 59)
    assert to_boundaries([L], Numbering.VLLM, L) == (L,)  # L = final layer output, pre-norm


def test_sglang_legacy_adds_one_unconditionally():
    assert to_boundaries([2, 30, 58], Numbering.SGLANG_LEGACY, L) == (3, 31, 59)
    assert to_boundaries([1, 29, 57], Numbering.SGLANG_LEGACY, L) == (2, 30, 58)


def test_sglang_pr25454_adds_one_only_when_first_id_is_one():
    assert to_boundaries([1, 29, 57], Numbering.SGLANG_PR25454, L) == (2, 30, 58)
    assert to_boundaries([2, 30, 58], Numbering.SGLANG_PR25454, L) == (2, 30, 58)


def test_specforge_and_modelopt_are_layer_outputs():
    assert to_boundaries([2, 30, 58], Numbering.SPECFORGE, L) == (3, 31, 59)
    assert to_boundaries([2, 30, 58], Numbering.MODELOPT, L) == (3, 31, 59)


def test_eagle_is_hard_coded():
    assert to_boundaries(None, Numbering.EAGLE, L) == (2, 30, 58)
    assert from_boundaries((2, 30, 58), Numbering.EAGLE, L) is None
    with pytest.raises(BoundaryError, match="hard-codes"):
        from_boundaries((3, 31, 59), Numbering.EAGLE, L)
    with pytest.raises(BoundaryError, match="takes no layer ids"):
        to_boundaries([2, 30, 58], Numbering.EAGLE, L)


def test_all_defaults_are_the_same_physical_states():
    bs = default_boundaries(L)
    assert to_boundaries(from_boundaries(bs, Numbering.SGLANG_LEGACY, L), Numbering.SGLANG_LEGACY, L) == bs
    assert from_boundaries(bs, Numbering.SGLANG_LEGACY, L) == (1, 29, 57)
    assert from_boundaries(bs, Numbering.VLLM, L) == (2, 30, 58)
    assert from_boundaries(bs, Numbering.SPECFORGE, L) == (1, 29, 57)


@pytest.mark.parametrize("numbering", [n for n in Numbering if n is not Numbering.EAGLE])
@pytest.mark.parametrize("boundaries", [(2, 30, 58), (3, 31, 59), (5, 40, 61), (10,)])
def test_round_trip_every_numbering(numbering, boundaries):
    ids = from_boundaries(boundaries, numbering, L)
    assert ids is not None
    assert to_boundaries(ids, numbering, L) == boundaries


def test_sglang_both_readings_of_field_report_ids():
    both = read_sglang_both([2, 30, 58], L)
    assert both.legacy == (3, 31, 59)
    assert both.pr25454 == (2, 30, 58)
    assert both.ambiguous


def test_default_ids_are_unambiguous_for_sglang():
    assert sglang_ids_unambiguous((2, 30, 58), L) == (1, 29, 57)
    assert not read_sglang_both([1, 29, 57], L).ambiguous


def test_non_default_boundaries_refused_without_generation():
    with pytest.raises(BoundaryError, match="PR #25454"):
        sglang_ids_unambiguous((3, 31, 59), L)


def test_sglang_cannot_capture_embedding():
    with pytest.raises(BoundaryError, match="embedding"):
        from_boundaries((0, 3, 31), Numbering.SGLANG_LEGACY, L)


def test_sglang_pr25454_cannot_express_first_boundary_one():
    with pytest.raises(BoundaryError, match="no id list"):
        from_boundaries((1, 30), Numbering.SGLANG_PR25454, L)


@pytest.mark.parametrize("ids", [[62], [-1, 2, 30], [3, 3]])
def test_invalid_ids_rejected(ids):
    with pytest.raises(BoundaryError):
        to_boundaries(ids, Numbering.VLLM, L)


def test_minus_one_embedding_hack_reads_as_boundary_zero_in_legacy_sglang():
    # The field reports' local patch: id -1 meant "embedding". Legacy +1 maps it to boundary 0.
    assert to_boundaries([-1, 2, 30], Numbering.SGLANG_LEGACY, L) == (0, 3, 31)


def test_describe():
    assert describe_boundary(0, L) == "embedding output"
    assert describe_boundary(3, L) == "output of layer 2"
    assert "last layer" in describe_boundary(L, L)
