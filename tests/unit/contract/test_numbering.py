"""The id rules (what one id means), round trips and invalid ids. The engine table (which rule each
engine release applies per target architecture, and what it can capture): test_engine_table.py."""

import pytest

from eaglewire.contract.numbering import (
    Numbering,
    default_boundaries,
    describe_boundary,
    from_boundaries,
    parse_version,
    to_boundaries,
)
from eaglewire.errors import BoundaryError, ConfigError

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


def test_layer_output_adds_one_unconditionally():
    assert to_boundaries([2, 30, 58], Numbering.LAYER_OUTPUT, L) == (3, 31, 59)
    assert to_boundaries([1, 29, 57], Numbering.LAYER_OUTPUT, L) == (2, 30, 58)


def test_pr25454_adds_one_only_when_first_id_is_one():
    assert to_boundaries([1, 29, 57], Numbering.PR25454, L) == (2, 30, 58)
    assert to_boundaries([2, 30, 58], Numbering.PR25454, L) == (2, 30, 58)


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
    assert to_boundaries(from_boundaries(bs, Numbering.LAYER_OUTPUT, L), Numbering.LAYER_OUTPUT, L) == bs
    assert from_boundaries(bs, Numbering.LAYER_OUTPUT, L) == (1, 29, 57)
    assert from_boundaries(bs, Numbering.VLLM, L) == (2, 30, 58)
    assert from_boundaries(bs, Numbering.SPECFORGE, L) == (1, 29, 57)


@pytest.mark.parametrize("numbering", [n for n in Numbering if n is not Numbering.EAGLE])
@pytest.mark.parametrize("boundaries", [(2, 30, 58), (3, 31, 59), (5, 40, 61), (10,)])
def test_round_trip_every_numbering(numbering, boundaries):
    ids = from_boundaries(boundaries, numbering, L)
    assert ids is not None
    assert to_boundaries(ids, numbering, L) == boundaries


def test_the_two_sglang_rules_read_the_field_report_ids_apart():
    assert to_boundaries([2, 30, 58], Numbering.LAYER_OUTPUT, L) == (3, 31, 59)
    assert to_boundaries([2, 30, 58], Numbering.PR25454, L) == (2, 30, 58)
    # the default boundaries start at 2: ids starting at 1, which both rules read alike
    assert {to_boundaries([1, 29, 57], n, L) for n in (Numbering.LAYER_OUTPUT, Numbering.PR25454)} == {
        (2, 30, 58)
    }


def test_rules_convert_the_embedding_capture_is_the_tables_concern():
    # id -1 (the field reports' embedding id) is boundary 0 under the layer-output rule; whether a release
    # captures it is the engine table's business (test_engine_table.py), not the rule's
    assert from_boundaries((0, 3, 31), Numbering.LAYER_OUTPUT, L) == (-1, 2, 30)
    assert from_boundaries((0, 3, 31), Numbering.PR25454, L) == (0, 3, 31)


def test_sglang_pr25454_cannot_express_first_boundary_one():
    with pytest.raises(BoundaryError, match="no id list"):
        from_boundaries((1, 30), Numbering.PR25454, L)


@pytest.mark.parametrize("ids", [[62], [-1, 2, 30], [3, 3]])
def test_invalid_ids_rejected(ids):
    with pytest.raises(BoundaryError):
        to_boundaries(ids, Numbering.VLLM, L)


def test_minus_one_reads_as_boundary_zero_under_the_layer_output_rule():
    # The field reports' id -1 meant "embedding": +1 maps it to boundary 0.
    assert to_boundaries([-1, 2, 30], Numbering.LAYER_OUTPUT, L) == (0, 3, 31)


def test_describe():
    assert describe_boundary(0, L) == "embedding output"
    assert describe_boundary(3, L) == "output of layer 2"
    assert "last layer" in describe_boundary(L, L)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("0.5.23", (0, 5, 23)),
        ("v0.5.9", (0, 5, 9)),
        ("0.5.15.post1", (0, 5, 15)),
        ("0.33.0+cu128", (0, 33, 0)),
    ],
)
def test_versions_compare_numerically(text, parts):
    assert parse_version(text).parts == parts
    assert parse_version("0.5.9") < parse_version("0.5.10")


@pytest.mark.parametrize("text", ["latest", "", "5", "0.x.1"])
def test_bad_versions_are_refused_naming_the_flag(text):
    with pytest.raises(ConfigError, match="--sglang-version: expected a release number"):
        parse_version(text, flag="--sglang-version")
