"""Fingerprints prove by values which boundary a tensor came from."""

import dataclasses

import pytest

from eaglewire.contract.fingerprint import StateKey
from eaglewire.errors import FingerprintMismatchError
from eaglewire.target.identity import build_contract, check_fingerprint
from tests.helpers.tiny import make_tiny_target


@pytest.fixture(scope="module")
def target():
    return make_tiny_target("llama", num_layers=12)


def test_fingerprint_confirms_itself(target):
    contract = build_contract(target, (2, 6, 9))
    matches = check_fingerprint(contract, target)
    assert all(m.ok for m in matches)
    assert [m.best for m in matches] == [StateKey(2), StateKey(6), StateKey(9), StateKey(12)]


def test_relabelled_tensors_are_identified(target):
    """The field reports' bug: tensors captured at 3/6/10 but labelled 2/5/9 (one off)."""
    actual = build_contract(target, (3, 6, 10))
    fp = actual.fingerprint
    relabelled = dataclasses.replace(
        fp,
        tensors=tuple(
            dataclasses.replace(t, boundary=b) for t, b in zip(fp.tensors, (2, 5, 9, 12), strict=True)
        ),
    )
    declared = dataclasses.replace(actual, aux_boundaries=(2, 5, 9), fingerprint=relabelled)
    with pytest.raises(FingerprintMismatchError) as e:
        check_fingerprint(declared, target)
    msg = str(e.value)
    assert "declared boundary 2 but the values are boundary 3" in msg
    assert "declared boundary 9 but the values are boundary 10" in msg
    matches = check_fingerprint(declared, target, raise_on_mismatch=False)
    assert [m.best.boundary for m in matches] == [3, 6, 10, 12]


def test_post_norm_final_is_told_apart(target):
    contract = build_contract(target, final_norm="post")
    fp = contract.fingerprint
    wrong = dataclasses.replace(
        fp, tensors=(*fp.tensors[:-1], dataclasses.replace(fp.tensors[-1], norm="pre"))
    )
    matches = check_fingerprint(
        dataclasses.replace(contract, fingerprint=wrong), target, raise_on_mismatch=False
    )
    assert matches[-1].best == StateKey(12, "post")
    assert not matches[-1].ok


def test_different_target_matches_nothing(target):
    contract = build_contract(target)
    other = make_tiny_target("llama", num_layers=12, seed=1)
    with pytest.raises(FingerprintMismatchError, match="matches no boundary"):
        check_fingerprint(contract, other)


def test_the_final_state_is_given_one_way(target):
    """build_contract takes the final state as a norm side (boundary L) or as a FinalState, not both;
    a refusal of the aux list names it as the caller says (`what`, e.g. a flag)."""
    from eaglewire.contract.contract import FinalState
    from eaglewire.errors import BoundaryError

    L = target.num_layers
    given = build_contract(target, [1, 2], final=FinalState(L - 1, "pre"), fingerprint=False)
    assert given.final == FinalState(L - 1, "pre") and given.aux_boundaries == (1, 2)
    assert build_contract(target, [1, 2], fingerprint=False).final == FinalState(L, "pre")
    with pytest.raises(ValueError, match="both given"):
        build_contract(target, [1, 2], final=FinalState(L, "pre"), final_norm="post", fingerprint=False)
    with pytest.raises(BoundaryError, match="--aux-boundaries"):
        build_contract(target, [1, L + 5], what="--aux-boundaries", fingerprint=False)
