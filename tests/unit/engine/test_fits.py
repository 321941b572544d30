"""`engine.fits`: the one rule a request's length is checked by (prompt + max_new_tokens + one draft tree
within the target's positions), its limits and its messages; and that the decoders apply it."""

from __future__ import annotations

import pytest

from eaglewire.draft.init import init_draft
from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.fits import ContextFit, model_positions
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import make_tiny_target

CHAIN = SpecArgs.chain(4)


def test_the_smaller_limit_counts_and_is_named() -> None:
    model = ContextFit.of(positions=64, capacity=None, tree_tokens=8)
    assert (model.limit, model.runner_bound, model.budget, model.room(40)) == (64, False, 56, 16)
    assert (
        ContextFit.of(positions=64, capacity=128, tree_tokens=8).limit == 64
    )  # a cache beyond the positions
    runner = ContextFit.of(positions=64, capacity=32, tree_tokens=0)
    assert (runner.limit, runner.runner_bound, runner.budget) == (32, True, 32)
    unknown = ContextFit.of(positions=None, capacity=None, tree_tokens=8)
    assert unknown.limit is None and unknown.fits(10**9, 10**9)
    unknown.check(10**9, 1)  # nothing known: nothing refused
    assert ContextFit.of(positions=None, capacity=16, tree_tokens=1).runner_bound


def test_exactly_full_fits_one_more_is_refused_naming_the_lengths() -> None:
    fit = ContextFit.of(positions=64, capacity=None, tree_tokens=8)
    fit.check(40, 16)
    with pytest.raises(ConfigError) as err:
        fit.check(41, 16, prompt="prompt long:3")
    text = str(err.value)
    assert text.startswith(
        "prompt long:3 does not fit the target's context: 41 prompt tokens + max_new_tokens=16 + a draft tree "
        "of 8 tokens (num_draft_tokens) = 65 positions, but the target has max_position_embeddings=64; "
        "at most 40 prompt tokens fit with max_new_tokens=16"
    )
    assert (
        "--max-new-tokens, use a smaller draft tree (--num-draft-tokens" in text
        and "no more positions" in text
    )
    plain = ContextFit.of(positions=None, capacity=20, tree_tokens=0)
    with pytest.raises(ConfigError, match=r"(?s)\(plain decoding: no draft tree\) = 21 positions, but the runner holds "
                                          r"max_seq_len=20.*larger max_seq_len") as err:  # fmt: skip
        plain.check(11, 10)
    assert "draft tree (" not in str(err.value)  # plain decoding has no tree to shrink


def test_a_set_names_its_first_prompt_that_does_not_fit_and_counts_the_rest() -> None:
    fit = ContextFit.of(positions=100, capacity=None, tree_tokens=4)
    fit.check_all([("a", 10), ("b", 90)], 6, where="prompt set s")  # 90 + 6 + 4 = 100: fits
    with pytest.raises(ConfigError) as err:
        fit.check_all([("a", 10), ("b", 91), ("c", 95), ("d", 93)], 6, where="prompt set s")
    text = str(err.value)
    assert text.startswith("prompt set s: prompt b does not fit the target's context: 91 prompt tokens")
    assert "3 of its 4 prompts do not fit (the longest: prompt c, 95 tokens); nothing was decoded" in text
    with pytest.raises(ConfigError, match="leave no room for a prompt"):
        fit.check_all([("a", 1)], 96, where="prompt set s")


def test_positions_from_a_config_object_or_dict() -> None:
    class Config:
        max_position_embeddings = 2048

    class Nested:
        text_config = Config()

    assert model_positions(Config()) == 2048 and model_positions(Nested()) == 2048
    assert model_positions({"max_position_embeddings": 96}) == 96 and model_positions({}) is None


@pytest.mark.parametrize("kind", ["hf", "fast"])
def test_the_decoder_refuses_by_the_model_positions_and_plain_keeps_no_tree(kind: str) -> None:
    """A runner larger than the model's positions: the positions count (named), and a plain request
    may use the positions a speculative one keeps for its tree."""
    target = make_tiny_target("llama", num_layers=2)
    contract = build_contract(target, (1, 2))
    positions = target.config.max_position_embeddings
    runner = make_runner(target, contract.aux_boundaries, kind, max_seq_len=positions + 64)
    decoder = SpeculativeDecoder(runner, init_draft(target, contract), CHAIN)
    tree = CHAIN.num_draft_tokens
    assert decoder.context_fit().limit == positions and decoder.context_fit(use_draft=False).tree_tokens == 0
    prompt = [5] * (positions - tree - 3)
    with pytest.raises(ConfigError, match=f"max_position_embeddings={positions}"):
        decoder.generate(prompt, max_new_tokens=4)
    decoder.context_fit(use_draft=False).check(len(prompt), 4)  # the same request fits plain decoding
