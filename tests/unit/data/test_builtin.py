"""Built-in sets: fixed, disjoint, stable held-out splits; Magpie prompts from the target."""

from __future__ import annotations

import pytest

from eaglewire.data.build import build_dataset, check_heldout
from eaglewire.data.builtin import heldout_split, load_builtin, stable_bucket
from eaglewire.data.formats import Message
from eaglewire.data.generation import SamplingConfig
from eaglewire.data.magpie import generate_magpie_prompts, magpie_id
from eaglewire.errors import ConfigError, DataFormatError
from tests.helpers.tiny import make_tiny_target, tiny_tokenizer

# Pinned: these must never change between versions (the split is a function of the id alone).
CHITCHAT_EVAL_IDS = [
    "chitchat:cdf96a2c-1ba5-4375-a65e-917b151ce04e",
    "chitchat:c2529680-6282-4497-9627-65da9f095050",
    "chitchat:ad3bb923-9548-4ea4-a0fb-25833173649f",
    "chitchat:4f0096fe-306b-4e8f-87c1-bbe9d29afd49",
]
CHITCHAT_TRAIN_ID = "chitchat:a07edb12-6b91-4138-b11e-02421888d699"


def test_chitchat_splits_disjoint_stable_and_pinned() -> None:
    train = load_builtin("chitchat", "train")
    evals = load_builtin("chitchat", "eval")
    train_ids = {c.record_id for c in train}
    eval_ids = [c.record_id for c in evals]
    assert not train_ids & set(eval_ids)
    assert len(train_ids) + len(eval_ids) == 7168
    assert len(eval_ids) == 387  # about 5%
    assert eval_ids[:4] == CHITCHAT_EVAL_IDS
    assert CHITCHAT_TRAIN_ID in train_ids
    assert all(heldout_split(r) == "eval" for r in CHITCHAT_EVAL_IDS)
    # stable_bucket depends on the id text only
    assert stable_bucket("chitchat:cdf96a2c-1ba5-4375-a65e-917b151ce04e") < 5
    # two speakers -> user/assistant
    first = next(c for c in train if c.record_id == CHITCHAT_TRAIN_ID)
    assert first.messages[0] == Message("user", "Hello\nHow are you doing today?")
    assert first.messages[1].role == "assistant" and first.messages[1].content.startswith("whats up MD")


def test_humaneval_split_by_index() -> None:
    train = load_builtin("humaneval", "train")
    evals = load_builtin("humaneval", "eval")
    eval_ids = [c.record_id for c in evals]
    assert len(train) + len(evals) == 164 and len(evals) == 33
    assert eval_ids[:3] == ["humaneval:HumanEval/0", "humaneval:HumanEval/5", "humaneval:HumanEval/10"]
    assert not {c.record_id for c in train} & set(eval_ids)
    assert "def has_close_elements" in evals[0].messages[0].content
    assert evals[0].messages[1].role == "assistant"


def test_training_build_refuses_heldout_ids() -> None:
    evals = load_builtin("humaneval", "eval")[:2]
    with pytest.raises(DataFormatError, match="held-out evaluation split"):
        build_dataset(evals, tiny_tokenizer(), split="train", show_progress=False)
    ds, _ = build_dataset(evals, tiny_tokenizer(), split="eval", max_length=None, show_progress=False)
    assert ds.meta["split"] == "eval" and len(ds) == 2
    check_heldout(["mine:1", "humaneval:HumanEval/1"], "train", where="x")  # no held-out id: fine


def test_unknown_builtin_and_magpie_without_target() -> None:
    with pytest.raises(ConfigError, match="unknown built-in set 'nope'"):
        load_builtin("nope")
    with pytest.raises(ConfigError, match="pass a target"):
        load_builtin("magpie")


def test_magpie_prompts_are_deduplicated_and_reproducible() -> None:
    target = make_tiny_target("llama", num_layers=2)
    cfg = SamplingConfig(max_new_tokens=6, temperature=1.0, top_p=1.0, seed=3, batch_size=8)
    a = generate_magpie_prompts(target, 8, sampling=cfg, keep_truncated=True, show_progress=False)
    b = generate_magpie_prompts(target, 8, sampling=cfg, keep_truncated=True, show_progress=False)
    assert [c.record_id for c in a] == [c.record_id for c in b]
    assert len(a) == 8 and len({c.record_id for c in a}) == 8
    assert all(len(c.messages) == 1 and c.messages[0].role == "user" for c in a)
    assert all(c.record_id == magpie_id(c.messages[0].content) for c in a)
    assert magpie_id("Hello  World") == magpie_id("hello world")
    split = load_builtin(
        "magpie", "eval", target=target, num_prompts=8, sampling=cfg, keep_truncated=True, show_progress=False
    )
    assert {c.record_id for c in split} == {c.record_id for c in a if heldout_split(c.record_id) == "eval"}
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        generate_magpie_prompts(target, 2, sampling=SamplingConfig(temperature=0.0), show_progress=False)


def test_magpie_prompt_starts_from_user_prefix_only() -> None:
    calls: list[list[int]] = []

    def recording_generate(t, prompts, max_new_tokens, temperature, top_p, seed, eos):  # type: ignore[no-untyped-def]
        calls.extend(prompts)
        return [[5 + (seed + i) % 50] * 3 + [eos[0]] for i in range(len(prompts))]

    target = make_tiny_target("llama", num_layers=2)
    cfg = SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=1.0, seed=0, batch_size=4)
    generate_magpie_prompts(target, 3, sampling=cfg, show_progress=False, generate_fn=recording_generate)
    assert target.tokenizer.decode(calls[0]) == "<|im_start|>user\n"


def test_magpie_openings_start_the_chosen_share_of_rows() -> None:
    """opened_fraction: that share of each round's rows is fed the user-turn prefix plus an
    opening (cycled through the list across rounds), and those prompts start with it; the others
    start from the bare prefix. 0 leaves every row bare."""
    from eaglewire.data.magpie import openings_for_round

    calls: list[list[int]] = []

    def recording_generate(t, prompts, max_new_tokens, temperature, top_p, seed, eos):  # type: ignore[no-untyped-def]
        calls.extend(prompts)
        return [[5 + (seed * 7 + i + k) % 50 for k in range(12)] + [eos[0]] for i in range(len(prompts))]

    target = make_tiny_target("llama", num_layers=2)
    tok = target.tokenizer
    cfg = SamplingConfig(max_new_tokens=16, temperature=1.0, top_p=1.0, seed=0, batch_size=4)
    openings = ("Write", "Solve", "Act as")
    out = generate_magpie_prompts(
        target, 8, sampling=cfg, show_progress=False, generate_fn=recording_generate, opened_fraction=0.5, openings=openings
    )  # fmt: skip
    fed = [tok.decode(ids) for ids in calls]
    assert fed[:4] == [
        "<|im_start|>user\nWrite",
        "<|im_start|>user\nSolve",
        "<|im_start|>user\n",
        "<|im_start|>user\n",
    ]
    assert fed[4:6] == ["<|im_start|>user\nAct as", "<|im_start|>user\nWrite"]  # the cycle goes on
    texts = [c.messages[0].content for c in out]
    assert sum(t.startswith(openings) for t in texts) == 4 and len(texts) == 8
    assert openings_for_round(4, 0.0, 3, openings) == [""] * 4
    assert openings_for_round(4, 1.0, 1, openings) == ["Solve", "Act as", "Write", "Solve"]
    with pytest.raises(ConfigError, match="opened_fraction: expected 0..1, got 1.5"):
        generate_magpie_prompts(target, 2, sampling=cfg, show_progress=False, opened_fraction=1.5)


def test_cached_magpie_prompts_refuse_a_rerun_that_asks_for_other_prompts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The cache answers a rerun with the same prompts; one asking for another count or opened share
    is refused, naming both values; another batch size (the pace) reuses them."""
    from dataclasses import replace as dc_replace

    from eaglewire.data.magpie import cached_magpie_prompts

    calls: list[int] = []

    def recording_generate(t, prompts, max_new_tokens, temperature, top_p, seed, eos):  # type: ignore[no-untyped-def]
        calls.append(len(prompts))
        return [[5 + (seed * 7 + i + k) % 50 for k in range(12)] + [eos[0]] for i in range(len(prompts))]

    target = make_tiny_target("llama", num_layers=2)
    cfg = SamplingConfig(max_new_tokens=16, temperature=1.0, top_p=1.0, seed=0, batch_size=4)
    path = tmp_path / "magpie.jsonl"

    def sampled(n: int, **kw):  # type: ignore[no-untyped-def]
        return cached_magpie_prompts(
            target, path, n, show_progress=False, generate_fn=recording_generate, **{"sampling": cfg, **kw}
        )

    first = sampled(6)
    assert calls and (tmp_path / "magpie.jsonl.settings.json").exists()
    n = len(calls)
    assert [c.record_id for c in sampled(6, sampling=dc_replace(cfg, batch_size=2))] == [
        c.record_id for c in first
    ]
    assert len(calls) == n  # read back, not sampled again
    with pytest.raises(ConfigError, match=r"num_prompts 6 -> 7") as err:
        sampled(7)
    assert "delete" in err.value.fix and "magpie.jsonl.settings.json" in err.value.fix
    with pytest.raises(ConfigError, match=r"opened_fraction 0.0 -> 0.5"):
        sampled(6, opened_fraction=0.5)
